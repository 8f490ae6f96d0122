"""The federation driver: what happens, in order, and what it yields.

``federation``          the driver: rounds → statistics → calibration → evaluation → outputs
``resume``              open the state directory or resume after the last completed round
``board``               what the RPC handlers read ("what does participant p do next?")
``tasks``               work handed to participants (train / statistics / evaluate)
``stages``              waiting on tasks, driving secure jobs, the one aggregation helper
``secure_job``          one ``crypto.SecAggServer`` job with deadlines, liveness, streaming;
                        journaled, and continued from its journal after a restart
``stage_grace``         the masked and later stages wait for a participant that restarts
``upload_queue``        a masked upload that opens with a header waits for a free slot
``masked_resend``       a masked upload sent again: identical is delivered, different refused
``halts``               test-only: stop the coordinator dead at a named point of a job
``rejoin``              between two attempts at a stage: back off, wait for participants
``futile_retry``        which refusals a retry meets again; no retry that cannot help
``training_rounds``     the training rounds: selection, server step, checkpoint
``strategy``            adapter around spherefed.algorithms' one registry: named sums laid
                        out in the aggregation vector, broadcasts, resumable server state
``bounds``              the declared bounds that size a job's ring (statistics, evaluation)
``model``               the global network's layout, checkpoints, saved models
``calibration_stage``   statistics jobs after training, then every configured head solved
``ffc_ccvr_heads``      FFC's closed form and CCVR's retraining from the secure sums
``discriminant_heads``  FFC+bias, LDA and QDA from the CCVR sums, ridge chosen on validation
``invariants``          what every honest calibration aggregate satisfies, checked first
``integrity``           cross-checks between independent sums; each site's bound
``validation_gate``     no calibrated head worse than none on validation; the round gate
``dp_releases``         the coordinator's side of noisy (DP) calibration releases
``dpsgd_rounds``        distributed DP-SGD rounds: the step's plan, job and noisy step
``evaluation_stage``    federated evaluation, and central when the coordinator has test data
``conduct``             what participants refused, and whom the coordinator excluded
``verdict``             the honest final status, and what each part of the result covers
``outputs``             saved models and the JSON summary
``progress_log``        which progress lines are DEBUG; the one line per round, with its ETA
"""
