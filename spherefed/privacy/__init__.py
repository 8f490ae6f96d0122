"""Privacy for the calibration service: sensitivity, accounting, ledger, audits, DP-SGD.

Modules, one idea each (``spherecal.crypto.dp`` holds the ring-side noise; this package may
import torch and Opacus):

``sensitivity``  L2/L1 sensitivity of FFC/CCVR releases in ring units, exact statistics
``accounting``   RDP curves (Skellam, distributed discrete Gaussian, Gaussian, DP-SGD),
                 composition, (ε, δ) conversion, calibration to a target ε
``charge``       :class:`PrivacyCharge`: what one release costs (its RDP curve and why)
``plan``         :func:`plan_calibration_release`: scale, noise and job-spec fields
``ledger``       :class:`PrivacyLedger` with memory / SQLite stores and budget refusal
``empirical``    canary audit: an empirical lower bound on ε beside the claimed one
``dpsgd``        local DP-SGD through Opacus, charged to the same ledger
``settings``     the ``[privacy]`` table shared by coordinator and participant configs
``evaluation_noise``
                 distributed DP noise on evaluation counts: the plan both sides compute
``example_count``  the noise on a site's training weight: plan, cost, the coordinator's ceiling
``secure_sum``   the calibration statistics summed by the real protocol, in process
``projection``   noisy sums projected onto what honest data can give (counts ≥ 0, PSD)
``distributed_dpsgd``  distributed DP-SGD's noise shares and record-level accounting
``dpsgd_step``   one site's Poisson-sampled, per-example-clipped gradient sum
``dpsgd_compare``  distributed, central (Opacus) and local DP-SGD trained at one ε
``calibration_compare``  DP calibration variants on the same noisy sums, and the gate

Only the light modules are imported here; ``empirical``, ``dpsgd``,
``dpsgd_compare`` and ``calibration_compare`` are imported explicitly by their users.
"""

from spherecal.spherefed.privacy.accounting import ORDERS, compose, epsilon
from spherecal.spherefed.privacy.charge import PrivacyCharge, dpsgd_charge, gaussian_charge
from spherecal.spherefed.privacy.ledger import (
    BudgetExceeded,
    DuplicateRelease,
    LedgerEntry,
    LedgerStore,
    MemoryLedgerStore,
    PrivacyBudget,
    PrivacyLedger,
    SqliteLedgerStore,
)
from spherecal.spherefed.privacy.plan import CalibrationPlan, plan_calibration_release
from spherecal.spherefed.privacy.sensitivity import (
    Sensitivity,
    exact_ccvr_statistics,
    exact_ffc_statistics,
    ring_sensitivity,
)

__all__ = [
    "ORDERS",
    "BudgetExceeded",
    "CalibrationPlan",
    "DuplicateRelease",
    "LedgerEntry",
    "LedgerStore",
    "MemoryLedgerStore",
    "PrivacyBudget",
    "PrivacyCharge",
    "PrivacyLedger",
    "Sensitivity",
    "SqliteLedgerStore",
    "compose",
    "dpsgd_charge",
    "epsilon",
    "exact_ccvr_statistics",
    "exact_ffc_statistics",
    "gaussian_charge",
    "plan_calibration_release",
    "ring_sensitivity",
]
