"""Certification bundles: ``verify`` accepts a bundle of a complete CONFORMANT run and rejects every tampering.

The bundles here are written by the same code a ``--certify`` run uses (:func:`suite.reports.write_reports`,
:func:`suite.certify.write_manifest`) from a hand-built complete run; ``tests/suite/test_server_ci_recipe.py``
makes one with a real ``--certify`` run (through the server-CI recipe) and verifies it with the installed
console script.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

import suite
from suite.certify import ENVELOPE, MANIFEST, PUBLIC_KEY, key_fingerprint, keygen, main, verify, write_manifest
from suite.outcomes import Verdict
from suite.reports import write_reports
from suite.settings import DEFAULT_BUDGET, RunSettings
from tests.conftest import ServerProcess, run_suite
from tests.suite.runs import RUN, changed, complete_records, results_of, target

TRIM = "dw::VERSION-TRIM::version_trimmed"
ROOT = Path(__file__).resolve().parents[2]


def _settings(**changes: Any) -> RunSettings:
    base = RunSettings(
        target="http://127.0.0.1:9",
        namespace="default",
        protocol_version="1.20",
        report_dir="reports",
        budget=DEFAULT_BUDGET,
        shrink=True,
        strict=False,
        certify=True,
        seed=7,
    )
    return replace(base, **changes)


def _bundle(folder: Path, records: list[Any] | None = None, *, key: Path | None = None, run_id: str = "") -> Path:
    results = results_of(records if records is not None else complete_records(), options={"certify": True})
    if run_id:
        results["run_id"] = run_id
    out = write_reports(results, folder)
    write_manifest(out, results, _settings(), target(), sign_key=str(key) if key else None)
    return out


def _rewrite_manifest(folder: Path) -> None:
    """A forger's next step: recompute every hash so the manifest matches the edited files."""
    write_manifest(folder, json.loads((folder / "results.json").read_text(encoding="utf-8")), _settings(), target())


def _edit_json(path: Path, edit: Any) -> None:
    doc = json.loads(path.read_text(encoding="utf-8"))
    edit(doc)
    path.write_text(json.dumps(doc, indent=2), encoding="utf-8")


def _rejected(folder: Path, because: str, public_key: Path | None = None) -> None:
    outcome = verify(folder, public_key)
    line = outcome.line
    assert outcome.status == "rejected", line
    assert outcome.exit_code(allow_unsigned=True) == 1
    assert line.startswith(f"REJECTED: {folder}: ")
    assert because in line, line
    assert "\n" not in line


def test_a_complete_conformant_unsigned_bundle_is_never_a_plain_verified(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Consistent files prove nothing about who made them: an unsigned bundle says so, and exits 3 unless the
    reader accepts that (--allow-unsigned)."""
    folder = _bundle(tmp_path / "run")
    manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    assert {f["path"] for f in manifest["files"]} == {"results.json", "junit.xml", "report.html"}
    assert manifest["registry"]["requirements"][0] == "VERSION-MISSING"
    assert manifest["target"]["discovery"]["server_id"] == "srv-1"
    assert len(manifest["suite"]["files"]["digest"]) == 64
    for argv, status in ((["verify", str(folder)], 3), (["verify", str(folder), "--allow-unsigned"], 0)):
        assert main(argv) == status
        out = capsys.readouterr().out.strip().splitlines()
        assert len(out) == 1
        assert out[0].startswith(f"UNSIGNED: {folder}: CONFORMANT"), out
        assert "anyone could have produced it" in out[0]
        assert "VERIFIED" not in out[0]


def test_the_bundle_names_the_suites_exact_build(tmp_path: Path) -> None:
    """The version and the commit of this checkout (with whether its suite files differ from it), so a third
    party can install the same build."""
    folder = _bundle(tmp_path / "run")
    build = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))["suite"]
    head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True, cwd=ROOT)
    assert build["version"] == suite.__version__
    assert build["commit"] == head.stdout.strip()
    assert build["source"] == "git checkout"
    assert isinstance(build["dirty"], bool)
    assert json.loads((folder / "results.json").read_text(encoding="utf-8"))["suite_build"] == build


def _relabel(folder: Path, old: str, new: str, *, skip: str = "") -> None:
    """A forger's relabelling: the target's URL replaced in every file that names it (except ``skip``), the
    hashes recomputed."""
    for name in ("results.json", "junit.xml", "report.html", MANIFEST):
        if name != skip:
            path = folder / name
            path.write_text(path.read_text(encoding="utf-8").replace(old, new), encoding="utf-8")
    manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    for entry in manifest["files"]:
        entry["sha256"] = hashlib.sha256((folder / entry["path"]).read_bytes()).hexdigest()
        entry["bytes"] = (folder / entry["path"]).stat().st_size
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True), encoding="utf-8")


def test_a_relabelled_unsigned_bundle_is_not_reported_verified(tmp_path: Path) -> None:
    folder = _bundle(tmp_path / "run")
    _relabel(folder, "http://127.0.0.1:9", "https://dw.vendor.example")
    results = json.loads((folder / "results.json").read_text(encoding="utf-8"))
    assert results["target"]["url"] == "https://dw.vendor.example"
    outcome = verify(folder)
    assert outcome.status == "unsigned", outcome.line
    assert not outcome.line.startswith("VERIFIED")
    assert "anyone could have produced it, this target's name included" in outcome.line
    assert main(["verify", str(folder)]) == 3


@pytest.mark.parametrize(
    ("skip", "named"),
    [
        ("junit.xml", "junit.xml names another target"),
        ("report.html", "report.html names another target"),
        (MANIFEST, "manifest.json names another target"),
    ],
)
def test_a_file_left_out_of_a_relabelling_is_named(tmp_path: Path, skip: str, named: str) -> None:
    folder = _bundle(tmp_path / "run")
    _relabel(folder, "http://127.0.0.1:9", "https://dw.vendor.example", skip=skip)
    _rejected(folder, named)


def test_a_command_line_run_against_another_target_is_rejected(tmp_path: Path) -> None:
    """The results name a vendor's URL, the recorded command line was run against the embedded server."""
    folder = _bundle(tmp_path / "run")
    _relabel(folder, "--target=http://127.0.0.1:9", "--target=embedded")
    _rejected(folder, "manifest.json names another target (command line's --target embedded)")


def test_a_bundle_of_a_run_that_is_not_conformant_is_rejected(tmp_path: Path) -> None:
    failing = changed(complete_records(), TRIM, verdict=Verdict.FAILED, failed_requirement="VERSION-TRIM")
    _rejected(_bundle(tmp_path / "failed", failing), "the run is NOT CONFORMANT")
    covered = changed(complete_records(), TRIM, verdict=Verdict.NOT_COVERED)
    _rejected(_bundle(tmp_path / "partial", covered), "the run is INCOMPLETE")


def test_a_verdict_flipped_in_results_json_is_rejected(tmp_path: Path) -> None:
    folder = _bundle(
        tmp_path / "run", changed(complete_records(), TRIM, verdict=Verdict.FAILED, failed_requirement="VERSION-TRIM")
    )

    def flip(doc: dict[str, Any]) -> None:
        next(r for r in doc["requirements"] if r["id"] == "VERSION-TRIM")["verdict"] = "passed"
        doc["summary"]["verdict"] = "CONFORMANT"

    _edit_json(folder / "results.json", flip)
    _rejected(folder, "results.json was changed after the run")
    _rewrite_manifest(folder)  # the hashes now match: the verdicts must still follow from the records
    _rejected(folder, "VERSION-TRIM is declared passed but its records say failed")


def test_a_failed_check_removed_is_rejected(tmp_path: Path) -> None:
    failing = changed(complete_records(), TRIM, verdict=Verdict.FAILED, failed_requirement="VERSION-TRIM")
    folder = _bundle(tmp_path / "run", failing)

    def drop(doc: dict[str, Any]) -> None:
        doc["checks"] = [c for c in doc["checks"] if c["test_id"] != TRIM]
        next(r for r in doc["requirements"] if r["id"] == "VERSION-TRIM")["verdict"] = "passed"
        doc["summary"]["verdict"] = "CONFORMANT"

    _edit_json(folder / "results.json", drop)
    _rejected(folder, "results.json was changed after the run")
    _rewrite_manifest(folder)
    _rejected(folder, f"item {TRIM} of the suite has no record in results.json")


@pytest.mark.parametrize("name", ["report.html", "junit.xml"])
def test_an_edited_report_is_rejected(tmp_path: Path, name: str) -> None:
    folder = _bundle(tmp_path / "run")
    path = folder / name
    path.write_text(path.read_text(encoding="utf-8").replace("VERSION-TRIM", "VERSION-TRIMMED"), encoding="utf-8")
    _rejected(folder, f"{name} was changed after the run")


@pytest.mark.parametrize("name", ["report.html", "junit.xml"])
def test_a_report_swapped_for_another_runs_is_rejected(tmp_path: Path, name: str) -> None:
    folder = _bundle(tmp_path / "run")
    other = _bundle(
        tmp_path / "other", changed(complete_records(), TRIM, verdict=Verdict.NOT_COVERED), run_id="other-run"
    )
    shutil.copy(other / name, folder / name)
    _rejected(folder, f"{name} was changed after the run")
    _rewrite_manifest(folder)
    _rejected(folder, f"{name} is from another run or states another verdict")


def test_a_manifest_from_another_run_is_rejected(tmp_path: Path) -> None:
    folder = _bundle(tmp_path / "run")
    other = _bundle(tmp_path / "other", run_id="20260102T000000Z-def456")
    shutil.copy(other / MANIFEST, folder / MANIFEST)
    _rejected(folder, f"the manifest is of run 20260102T000000Z-def456, the results of run {RUN['run_id']}")


def test_an_unlisted_or_missing_file_is_rejected(tmp_path: Path) -> None:
    folder = _bundle(tmp_path / "run")
    (folder / "extra.txt").write_text("slipped in", encoding="utf-8")
    _rejected(folder, "extra.txt is in the bundle but not in the manifest")
    (folder / "extra.txt").unlink()
    (folder / "junit.xml").unlink()
    _rejected(folder, "junit.xml is listed in the manifest but missing")


def test_a_narrowed_or_reduced_run_is_rejected_even_with_matching_hashes(tmp_path: Path) -> None:
    folder = _bundle(tmp_path / "run")

    def narrow(doc: dict[str, Any]) -> None:
        doc["completeness"]["narrowed_by"] = ["-k 'version'"]

    _edit_json(folder / "results.json", narrow)
    _rewrite_manifest(folder)
    _rejected(folder, "the run was narrowed: -k 'version'")


def test_results_that_break_their_schema_are_rejected(tmp_path: Path) -> None:
    folder = _bundle(tmp_path / "run")
    _edit_json(folder / "results.json", lambda doc: doc["requirements"][0].update(verdict="great"))
    _rewrite_manifest(folder)
    _rejected(folder, "results.json does not match its schema at requirements/0/verdict")


def test_a_bundle_made_by_another_build_names_the_build_to_install(tmp_path: Path) -> None:
    folder = _bundle(tmp_path / "run")
    other = {"commit": "a" * 40, "dirty": False, "repository": "https://git.example/dw-conformance"}
    _edit_json(
        folder / MANIFEST, lambda doc: (doc["suite"].update(other), doc["suite"]["files"].update(digest="0" * 64))
    )
    _rejected(
        folder,
        f"made by suite {suite.__version__} at commit aaaaaaaaaaaa; this is suite {suite.__version__} at commit ",
    )
    _rejected(
        folder, "install that build: pip install 'dw-conformance @ git+https://git.example/dw-conformance@" + "a" * 40
    )
    _edit_json(folder / MANIFEST, lambda doc: doc["suite"].update(dirty=True))
    _rejected(folder, "with uncommitted changes on commit aaaaaaaaaaaa, so no one else can install that build")


def test_a_signed_bundle_verifies_with_its_key_and_not_with_another(tmp_path: Path) -> None:
    private, public = keygen(tmp_path / "vendor.key")
    _, stranger = keygen(tmp_path / "stranger.key")
    assert private.stat().st_mode & 0o077 == 0  # the private key is readable by its owner only
    folder = _bundle(tmp_path / "run", key=private)
    envelope = json.loads((folder / ENVELOPE).read_text(encoding="utf-8"))
    assert envelope["payloadType"] == "application/vnd.in-toto+json"
    fp = key_fingerprint(private)
    assert fp == f"ed25519:{envelope['signatures'][0]['keyid']}"
    outcome = verify(folder, public)
    assert outcome.status == "verified", outcome.line
    assert outcome.line.startswith(f"VERIFIED: signed by {fp}: {folder}: CONFORMANT"), outcome.line
    assert main(["verify", str(folder), "--public-key", str(public)]) == 0
    # Without the signer's key: the key the bundle carries, by its fingerprint, to compare with the published one.
    carried = verify(folder)
    assert carried.line.startswith(f"VERIFIED: signed by {fp} (the key in {PUBLIC_KEY}: compare it"), carried.line
    _rejected(folder, f"{ENVELOPE} is not signed by the key in {stranger}", stranger)
    with pytest.raises(FileExistsError):
        keygen(tmp_path / "vendor.key")


def test_a_signed_bundle_whose_files_were_re_hashed_fails_the_signature(tmp_path: Path) -> None:
    private, public = keygen(tmp_path / "vendor.key")
    folder = _bundle(tmp_path / "run", key=private)
    page = folder / "report.html"
    page.write_text(page.read_text(encoding="utf-8") + "<!-- edited -->", encoding="utf-8")
    _rewrite_manifest(folder)  # the forger rewrites the manifest but cannot sign it
    _rejected(folder, "the signed statement does not match the bundle's files", public)


def test_the_console_script_is_installed(tmp_path: Path) -> None:
    script = Path(sys.executable).with_name("dw-certify")
    assert script.exists()
    proc = subprocess.run([str(script), "verify", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert proc.stdout.strip() == f"REJECTED: {tmp_path}: no manifest: not a --certify bundle ({MANIFEST})"


def test_a_certification_says_where_its_bundle_is_and_whether_it_is_signed(tmp_path: Path) -> None:
    """The end of a --certify run and its report.html: the bundle, the signature status, the key's fingerprint
    and the command that verifies it; an ordinary run's report says it is not a certification."""
    from suite.certify import certification, certification_lines

    private, _ = keygen(tmp_path / "vendor.key")
    fp = key_fingerprint(private)
    cases = {
        "signed": (_settings(sign_key=str(private)), f"yes, signed by {fp}"),
        "unsigned": (_settings(), "yes, unsigned: anyone could have produced this bundle"),
        "ordinary": (_settings(certify=False), "no: an ordinary run, no bundle"),
    }
    for name, (settings, shown) in cases.items():
        results = results_of(complete_records(), options={"certify": settings.certify})
        results["certification"] = certification(settings)
        out = write_reports(results, tmp_path / name)
        page = (out / "report.html").read_text(encoding="utf-8")
        assert f"<tr><th>Certification</th><td><code>{shown}" in page, name
        if not settings.certify:
            continue
        lines = certification_lines(out, results, str(private))
        assert lines[0] == f"certification bundle: {out / MANIFEST}"
        if name == "signed":
            assert lines[1].startswith(f"  signed by {fp}")
            assert lines[2] == f"  verify: dw-certify verify {out} --public-key {private}.pub"
        else:
            assert lines[1].startswith("  unsigned: anyone could have produced such a bundle")
            assert lines[2] == f"  verify: dw-certify verify {out} --allow-unsigned"


def test_a_certification_run_ends_with_its_bundle_signature_and_verify_command(
    server_factory: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    """A real --certify run (stopped at its first failure by -x, against a server broken in one rule, so it is
    quick): its last lines name the bundle, the key's fingerprint and the command that verifies it, and its
    report.html says it is a signed certification."""
    private, _ = keygen(tmp_path / "vendor.key")
    server = server_factory("--fault", "ignore-version-header")
    run = run_suite(server.url, tmp_path / "reports", "--certify", "-x", f"--sign-key={private}")
    assert run.returncode == 1, run.stdout[-3000:]
    (folder,) = [p.parent for p in (tmp_path / "reports").glob(f"*/{MANIFEST}")]
    fp = key_fingerprint(private)
    assert f"\ncertification bundle: {folder / MANIFEST}\n  signed by {fp} (" in run.stdout, run.stdout[-3000:]
    assert f"\n  verify: dw-certify verify {folder} --public-key {private}.pub\n" in run.stdout
    assert (folder / ENVELOPE).is_file()
    assert (folder / PUBLIC_KEY).is_file()
    page = (folder / "report.html").read_text(encoding="utf-8")
    assert f"<tr><th>Certification</th><td><code>yes, signed by {fp} (manifest.intoto.json)" in page
    results = json.loads((folder / "results.json").read_text(encoding="utf-8"))
    assert results["certification"] == {"certify": True, "signed": True, "key_fingerprint": fp}


def test_a_bundle_whose_machines_left_applicable_cells_not_reached_is_rejected(tmp_path: Path) -> None:
    """Its own run said CONFORMANT (it was not a certification run); the bundle's cells, re-derived, make it
    INCOMPLETE: a certification reaches every applicable coverage cell."""
    records = complete_records()
    partial = [
        replace(r, cells={k: v for k, v in r.cells.items() if not k.startswith("workflow_task/requeued/")})
        if r.cells is not None
        else r
        for r in records
    ]
    _rejected(_bundle(tmp_path / "b", partial), "the records make it INCOMPLETE")
