"""Bad input ends in one line on stderr and exit status 2 — never a traceback.

One test per row of the table in ``docs/cli.md``. Output paths are checked *before*
any work: the stderr of those rows holds nothing but the error line (a run that had
started training would have printed progress first).
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from spherecal.cli.app import main

REPO = Path(__file__).resolve().parents[3]


def _one_line_error(capsys: pytest.CaptureFixture[str], code: int, *needles: str) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2, err
    assert len(lines) == 1, err
    assert "Traceback" not in err
    assert lines[0].startswith("spherecal ") and ": error: " in lines[0], lines[0]
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def _cifar_dir(tmp_path: Path, content: bytes) -> Path:
    folder = tmp_path / "cifar" / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    for name in [*(f"data_batch_{i}" for i in range(1, 6)), "test_batch"]:
        (folder / name).write_bytes(content)
    return folder.parent


def _reference(*extra: str) -> list[str]:
    return ["reference", "--participants", "2", "--rounds", "1", "--quiet", *extra]


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (b"this is a text file, not a pickle\n", "not a CIFAR python-pickle batch"),
        (b"", "empty file"),
        (pickle.dumps({b"data": 1}, protocol=2)[:9], "not a CIFAR python-pickle batch"),
    ],
    ids=["text", "empty", "truncated"],
)
def test_unusable_cifar_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes, needle: str
) -> None:
    root = _cifar_dir(tmp_path, content)
    code = main(_reference("--dataset", "cifar10", "--data-root", str(root), "--model", "mlp"))
    _one_line_error(capsys, code, "data_batch_1", needle)


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (b"", "not a valid .npz file (empty"),
        (b"x,y\n1,2\n", "not a valid .npz file (text, not a zip archive"),
        (b"\x93NUMPY\x01\x00", "got a single array"),
        (b"PK\x03\x04garbled", "not a valid .npz file"),
    ],
    ids=["empty", "text", "npy", "truncated-zip"],
)
def test_unusable_npz_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes, needle: str
) -> None:
    path = tmp_path / "site.npz"
    path.write_bytes(content)
    code = main(_reference("--dataset", "npz", "--data-root", str(path), "--model", "mlp"))
    _one_line_error(capsys, code, str(path), needle)


def test_npz_with_wrong_keys(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "site.npz"
    np.savez(path, images=np.zeros((4, 3), dtype=np.float32))
    code = main(_reference("--dataset", "npz", "--data-root", str(path), "--model", "mlp"))
    _one_line_error(capsys, code, "missing keys")


def test_missing_data_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(_reference("--dataset", "npz", "--data-root", str(tmp_path / "nope.npz")))
    _one_line_error(capsys, code, "nope.npz")


def test_reference_json_under_a_regular_file_fails_before_training(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    code = main(["reference", "--participants", "2", "--json", str(blocker / "out.json")])
    # Without --quiet, a started run would have printed "[reference] ..." progress.
    _one_line_error(capsys, code, "--json", f"{blocker} is a regular file")


def _denied_dir(tmp_path: Path) -> Path:
    """A directory this process cannot write into (root ignores mode bits: /sys)."""
    if os.geteuid() == 0:
        return Path("/sys/spherecal-test-denied")
    target = tmp_path / "locked"
    target.mkdir()
    target.chmod(0o500)
    return target


def test_reference_json_permission_denied(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = _denied_dir(tmp_path) / "out.json"
    code = main(["reference", "--participants", "2", "--json", str(target)])
    _one_line_error(capsys, code, "--json", "permission denied")


def test_reference_json_is_a_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["reference", "--participants", "2", "--json", str(tmp_path)])
    _one_line_error(capsys, code, "it is a directory")


def test_simulate_out_under_a_regular_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    code = main(["simulate", "--out", str(blocker / "run"), "--participants", "2"])
    _one_line_error(capsys, code, "--out", "is a regular file")


def test_simulate_out_permission_denied(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["simulate", "--out", str(_denied_dir(tmp_path) / "run"), "--participants", "2"])
    _one_line_error(capsys, code, "--out", "permission denied")


def test_predict_rows(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "data.npz"
    data.write_text("garbled")
    code = main(["predict", "--model-dir", str(tmp_path), "--data", str(data)])
    _one_line_error(capsys, code, "not a valid .npz")
    np.savez(data, x=np.zeros((2, 1, 8, 8), dtype=np.float32))
    code = main(["predict", "--model-dir", str(tmp_path), "--data", str(data)])
    _one_line_error(capsys, code, "no model_spec.json")
    code = main(
        ["predict", "--model-dir", str(tmp_path), "--data", str(data), "--out", str(data / "p")]
    )
    _one_line_error(capsys, code, "--out", "is a regular file")


# ---------------------------------------------------------------- service configs
def _participant_toml(tmp_path: Path, **extra: str) -> Path:
    lines = [
        "[participant]",
        'id = "p0"',
        'coordinator = "127.0.0.1:1"',
        *(f"{k} = {v}" for k, v in extra.items()),
        "[tls]",
        'ca = "certs/ca.pem"',
        'cert = "certs/p0.pem"',
        'key = "certs/p0.key"',
    ]
    path = tmp_path / "participant.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_participant_missing_certificate_names_the_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _participant_toml(tmp_path)
    code = main(["participant", "--config", str(config)])
    _one_line_error(capsys, code, "[tls] ca", "does not exist", str(config))


def test_participant_out_dir_under_a_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from spherecal.certs import init_ca, issue_participant

    init_ca(tmp_path / "certs")  # real TLS material: preflight checks it before out_dir
    issue_participant(tmp_path / "certs", "p0")
    (tmp_path / "blocker").write_text("x")
    config = _participant_toml(tmp_path, out_dir='"blocker/out"')
    config.write_text(config.read_text() + "[policy]\ntrust_ca_for_members = true\n")
    code = main(["participant", "--config", str(config)])
    _one_line_error(capsys, code, "[participant] out_dir", "is a regular file")


def test_participant_without_pinned_peers_says_how_to_pin(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A site under TLS that pins no members and does not say the CA alone decides
    does not start: one line, with its own `certs pin` line to share."""
    from spherecal.certs import init_ca, issue_participant
    from spherecal.participant.trust import pin_line
    from spherecal.proto.identity import load_identity_key, public_key_bytes

    init_ca(tmp_path / "certs")
    issue_participant(tmp_path / "certs", "p0")
    config = _participant_toml(tmp_path, identity_key='"certs/p0.identity.key"')
    code = main(["participant", "--config", str(config)])
    own = public_key_bytes(load_identity_key(tmp_path / "certs" / "p0.identity.key"))
    line = _one_line_error(capsys, code, "[tls] peer_keys is not set", "trust_ca_for_members")
    assert pin_line("p0", own) in line, line
    assert not (tmp_path / "participant-p0").exists()  # refused before its state existed


def test_participant_certificate_outside_its_validity_window(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An expired certificate is refused in every TLS handshake, and the site only saw
    "Socket closed" for give_up_s: now one line at start with its dates."""
    from spherecal.certs import init_ca, issue_participant
    from tests.cert_dates import redate

    init_ca(tmp_path / "certs")
    issue_participant(tmp_path / "certs", "p0")
    redate(tmp_path / "certs", tmp_path / "certs" / "p0.pem", start_days=-9, end_days=-1)
    config = _participant_toml(tmp_path, identity_key='"certs/p0.identity.key"')
    code = main(["participant", "--config", str(config)])
    _one_line_error(capsys, code, "[tls] cert = ", "p0.pem' expired on", "certs request p0")


def test_participant_identity_key_that_its_certificate_does_not_bind(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from spherecal.certs import init_ca, issue_participant

    init_ca(tmp_path / "certs")
    issue_participant(tmp_path / "certs", "p0")
    issue_participant(tmp_path / "certs", "p1")  # another identity key
    config = _participant_toml(tmp_path, identity_key='"certs/p1.identity.key"')
    code = main(["participant", "--config", str(config)])
    _one_line_error(capsys, code, "identity_key = ", "p1.identity.key' is key ", "binds key ")


def test_certs_days_below_one(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["certs", "init", str(tmp_path / "ca"), "--days", "0"])
    _one_line_error(capsys, code, "--days 0: a certificate must be valid for at least 1 day")


def test_coordinator_missing_certificate_names_the_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "coordinator.toml"
    config.write_text(
        '[federation]\nparticipants = ["p0", "p1"]\n'
        '[tls]\ncert = "server.pem"\nkey = "server.key"\nclient_ca = "ca.pem"\n'
    )
    (tmp_path / "server.pem").write_text("x")
    code = main(["coordinator", "--config", str(config)])
    _one_line_error(capsys, code, "[tls] key", "does not exist")


def test_as_a_process_no_traceback(tmp_path: Path) -> None:
    """The real entry point (``python -m spherecal.cli``) behaves the same."""
    path = tmp_path / "site.npz"
    path.write_bytes(b"")
    proc = subprocess.run(
        [sys.executable, "-m", "spherecal.cli", *_reference("--dataset", "npz")]
        + ["--data-root", str(path)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_a_text_file_as_npz_never_blames_pickles(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # numpy's own message for a non-zip file is "pickled data": it sent users looking
    # for object arrays that were not there
    data = tmp_path / "data.npz"
    data.write_text("index,label\n0,1\n")
    code = main(["predict", "--model-dir", str(tmp_path), "--data", str(data)])
    line = _one_line_error(capsys, code, "text, not a zip archive")
    assert "pickle" not in line


def test_predict_refuses_labels_the_model_does_not_have(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    from spherecal.spherefed.network import ModelSpec, build_model
    from spherecal.spherefed.saved import model_spec_document, save_state_dict

    spec = ModelSpec(extractor="mlp", num_classes=3, in_channels=1, image_size=4)
    net = build_model(spec)
    model_dir = tmp_path / "model"
    save_state_dict(net.state_dict(), model_dir / "model_none.pt")
    document = model_spec_document(spec, net.feature_dim)
    (model_dir / "model_spec.json").write_text(json.dumps(document))
    data = tmp_path / "data.npz"
    x = np.zeros((5, 1, 4, 4), dtype=np.float32)
    np.savez(data, x=x, y=np.array([0, 1, 2, 3, 7]))
    code = main(["predict", "--model-dir", str(model_dir), "--data", str(data)])
    _one_line_error(capsys, code, "2 of 5 labels are not classes of this model", "0..2")
    np.savez(data, x=x, y=np.array([0, 1, 2, 2, 1]))  # in range: an accuracy, exit 0
    assert main(["predict", "--model-dir", str(model_dir), "--data", str(data)]) == 0
    assert json.loads(capsys.readouterr().out)["samples"] == 5


def test_audit_checks_its_output_paths_before_reading_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--html DIR`` ended in ``[Errno 21] Is a directory`` after the audit had run
    (and written audit.json); now the path is checked first, as every command's."""
    missing = tmp_path / "no-run"  # never read: the output path is refused first
    code = main(["audit", str(missing), "--html", str(tmp_path)])
    _one_line_error(capsys, code, f"cannot write --html {tmp_path}: it is a directory")
    blocker = tmp_path / "file"
    blocker.write_text("x")
    code = main(["audit", str(missing), "--out", str(blocker / "audit.json")])
    _one_line_error(capsys, code, "cannot write --out", f"{blocker} is a regular file")
    code = main(["audit", "--site", str(missing), "--html", str(tmp_path)])
    _one_line_error(capsys, code, f"cannot write --html {tmp_path}: it is a directory")


def test_audit_site_says_what_it_wants(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """PATH and --site together ran the site audit and ignored PATH; a config file
    given as the state directory said only "file is not a database"."""
    run = tmp_path / "run"
    (run / "state" / "p0").mkdir(parents=True)
    code = main(["audit", str(run), "--site", str(run / "state" / "p0")])
    _one_line_error(capsys, code, "not both")
    config = tmp_path / "p0.toml"
    config.write_text('[participant]\nid = "p0"\n' * 100)
    code = main(["audit", "--site", str(config)])
    _one_line_error(capsys, code, f"{config}: not a site's release ledger", "state_dir")
    code = main(["audit", "--site", str(run)])
    _one_line_error(capsys, code, "no release ledger", f"each site's in {run / 'state'}/<id>")
    code = main(["audit", "--site", str(tmp_path / "nowhere")])
    _one_line_error(capsys, code, "no such directory")


def test_a_misspelt_config_key_is_answered_with_the_right_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An unknown key or section said only that it was unknown; the line now names the
    known one it is closest to, when there is one."""
    site = tmp_path / "participant.toml"
    site.write_text('[participant]\nid = "p0"\ncoordinater = "127.0.0.1:50051"\n')
    code = main(["participant", "--config", str(site)])
    _one_line_error(capsys, code, "['coordinater'] ('coordinater': did you mean 'coordinator'?)")
    site.write_text('[participant]\nid = "p0"\n[TLS]\nca = "ca.pem"\n')
    code = main(["participant", "--config", str(site)])
    _one_line_error(capsys, code, "'TLS': did you mean 'tls'?")
    site.write_text('[participant]\nid = "p0"\nfrobnicate = 1\n')
    line = _one_line_error(capsys, main(["participant", "--config", str(site)]), "['frobnicate']")
    assert "did you mean" not in line  # nothing close: no guess
    config = tmp_path / "coordinator.toml"
    config.write_text('[federation]\nparticipants = ["p0", "p1", "p2"]\n[training]\nround = 3\n')
    code = main(["coordinator", "--config", str(config)])
    _one_line_error(capsys, code, "'round': did you mean 'rounds'?")
    table = tmp_path / "simulate.toml"
    table.write_text("[simulate]\nparticipant = 4\n")
    code = main(["simulate", "--config", str(table), "--out", str(tmp_path / "run")])
    _one_line_error(capsys, code, "'participant': did you mean 'participants'?")
