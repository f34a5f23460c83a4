"""Certification bundles that anyone can verify, and their optional signature.

A ``--certify`` run writes ``reports/<run-id>/manifest.json`` beside its reports: the sha256 of every file of
the run (``results.json``, ``junit.xml``, ``report.html``, the recorded exchanges of replay bundles), the suite
version and a digest of the installed suite's own files, the registry's requirement IDs, the target's
discovery document, the command line and options, start and finish in UTC, Python and platform. With
``--sign-key`` it also writes ``manifest.intoto.json``: an in-toto Statement (subject: every file of the
bundle by digest, predicate: the manifest) in a DSSE envelope signed with Ed25519.

``python -m suite.certify verify DIR [--public-key FILE]`` (also ``dw-certify verify``) re-checks all of it —
the hashes, the JSON schemas, the registry, the completeness of the run, the verdicts re-derived from the
run's own records, the junit and HTML files against the results — and prints one line; exit 0 when the
bundle is a valid certification of a CONFORMANT run, 1 otherwise. ``python -m suite.certify keygen PATH``
writes an Ed25519 key pair (``PATH``, ``PATH.pub``).
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import html
import json
import platform
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any
from xml.etree import ElementTree as ET

import schemas
import suite
from suite.protocol.requirements import REGISTRY

from .keys import keygen, load_private_key, load_public_key
from .outcomes import Record, RunVerdict
from .results import CHECKED, Completeness, aggregate, capability_ledger, decide, summarize
from .settings import DEFAULT_BUDGET, Budget

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

    from .context import TargetInfo
    from .settings import RunSettings

__all__ = [
    "ENVELOPE",
    "MANIFEST",
    "keygen",
    "load_private_key",
    "load_public_key",
    "main",
    "suite_digest",
    "verify",
    "write_manifest",
]

MANIFEST = "manifest.json"
ENVELOPE = "manifest.intoto.json"
MANIFEST_SCHEMA = "durable-workflow.conformance-manifest.v1"
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://durable-workflow.dev/conformance/manifest/v1"
PAYLOAD_TYPE = "application/vnd.in-toto+json"
REQUIRED_FILES = ("results.json", "junit.xml", "report.html")


# -- digests ---------------------------------------------------------------------------------------------------


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _bundle_files(folder: Path) -> Iterator[Path]:
    for path in sorted(folder.rglob("*")):
        if path.is_file() and path.name not in (MANIFEST, ENVELOPE):
            yield path


def suite_digest() -> dict[str, Any]:
    """One sha256 over the installed suite's own files (``suite`` and ``schemas``, without bytecode): a
    modified suite gives another digest."""
    digest = hashlib.sha256()
    count = 0
    for package in (Path(suite.__file__).parent, Path(schemas.__file__).parent):
        for path in sorted(package.rglob("*")):
            if not path.is_file() or "__pycache__" in path.parts or path.suffix in (".pyc", ".pyo"):
                continue
            rel = f"{package.name}/{path.relative_to(package).as_posix()}"
            digest.update(f"{rel}\0{_sha256(path)}\n".encode())
            count += 1
    return {"algorithm": "sha256", "files": count, "digest": digest.hexdigest()}


# -- writing ---------------------------------------------------------------------------------------------------


def write_manifest(
    out_dir: Path,
    results: Mapping[str, Any],
    settings: RunSettings,
    target: TargetInfo,
    *,
    sign_key: str | None = None,
) -> Path:
    """Write ``manifest.json`` (and, with ``sign_key``, ``manifest.intoto.json``) for the run in ``out_dir``."""
    files = [
        {"path": p.relative_to(out_dir).as_posix(), "sha256": _sha256(p), "bytes": p.stat().st_size}
        for p in _bundle_files(out_dir)
    ]
    manifest = {
        "schema": MANIFEST_SCHEMA,
        "run_id": results["run_id"],
        "verdict": results["summary"]["verdict"],
        "headline": results["summary"]["headline"],
        "started_at": results["started_at"],
        "finished_at": results["finished_at"],
        "suite": {"version": suite.__version__, "files": suite_digest()},
        "registry": {"version": suite.__version__, "requirements": list(REGISTRY)},
        "target": {
            "url": target.url,
            "description": results["target"]["description"],
            "discovery": target.cluster_info,
        },
        "command": results.get("command", ""),
        "options": results["options"],
        "settings": {**settings.to_json(), "sign_key": None},
        "python": {"version": platform.python_version(), "implementation": platform.python_implementation()},
        "platform": platform.platform(),
        "files": files,
    }
    path = out_dir / MANIFEST
    path.write_text(json.dumps(manifest, indent=2, sort_keys=True, default=str), encoding="utf-8")
    if sign_key is not None:
        envelope = sign(out_dir, load_private_key(Path(sign_key)))
        (out_dir / ENVELOPE).write_text(json.dumps(envelope, indent=2), encoding="utf-8")
    return path


# -- signing (DSSE over an in-toto Statement) -----------------------------------------------------------------


def _pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE's pre-authentication encoding: what is signed, so the payload type cannot be swapped."""
    kind = payload_type.encode()
    return b"DSSEv1 %d %s %d %s" % (len(kind), kind, len(payload), payload)


def _keyid(public: Ed25519PublicKey) -> str:
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    return hashlib.sha256(public.public_bytes(Encoding.Raw, PublicFormat.Raw)).hexdigest()


def _statement(out_dir: Path) -> dict[str, Any]:
    manifest = json.loads((out_dir / MANIFEST).read_text(encoding="utf-8"))
    subjects = [{"name": f["path"], "digest": {"sha256": f["sha256"]}} for f in manifest["files"]]
    subjects.append({"name": MANIFEST, "digest": {"sha256": _sha256(out_dir / MANIFEST)}})
    return {"_type": STATEMENT_TYPE, "subject": subjects, "predicateType": PREDICATE_TYPE, "predicate": manifest}


def sign(out_dir: Path, key: Ed25519PrivateKey) -> dict[str, Any]:
    payload = json.dumps(_statement(out_dir), sort_keys=True, separators=(",", ":")).encode()
    signature = key.sign(_pae(PAYLOAD_TYPE, payload))
    return {
        "payloadType": PAYLOAD_TYPE,
        "payload": base64.b64encode(payload).decode(),
        "signatures": [{"keyid": _keyid(key.public_key()), "sig": base64.b64encode(signature).decode()}],
    }


# -- verifying -------------------------------------------------------------------------------------------------


class Rejected(Exception):
    """The bundle is not a valid certification; the message says the first reason why."""


def _load(path: Path, what: str) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise Rejected(f"no {what} ({path.name})") from None
    except (OSError, ValueError) as exc:
        raise Rejected(f"{path.name} is not readable JSON: {exc}") from None


def _schema_valid(doc: Any, schema: str, name: str) -> None:
    # jsonschema-rs (a dependency of Schemathesis) validates a run's results many times faster than the
    # pure-Python validator (bench/RESULTS.md, "Verifying a bundle"); both implement Draft 2020-12.
    try:
        import jsonschema_rs

        rs_error = next(iter(jsonschema_rs.validator_for(schemas.load_json(schema)).iter_errors(doc)), None)
        problem = None if rs_error is None else ("/".join(map(str, rs_error.instance_path)), rs_error.message)
    except ImportError:
        from jsonschema import Draft202012Validator

        error = next(iter(Draft202012Validator(schemas.load_json(schema)).iter_errors(doc)), None)
        problem = None if error is None else ("/".join(str(p) for p in error.absolute_path), error.message)
    if problem is not None:
        where, message = problem
        raise Rejected(f"{name} does not match its schema at {where or 'the document'}: {message[:200]}")


def _check_files(folder: Path, manifest: Mapping[str, Any]) -> None:
    listed = {f["path"]: f for f in manifest["files"]}
    for name in REQUIRED_FILES:
        if name not in listed:
            raise Rejected(f"the manifest does not list {name}")
    for rel, entry in listed.items():
        path = folder / rel
        if not path.is_file():
            raise Rejected(f"{rel} is listed in the manifest but missing")
        if _sha256(path) != entry["sha256"]:
            raise Rejected(f"{rel} was changed after the run: its sha256 does not match the manifest")
    extra = [p.relative_to(folder).as_posix() for p in _bundle_files(folder)]
    unlisted = sorted(set(extra) - set(listed))
    if unlisted:
        raise Rejected(f"{unlisted[0]} is in the bundle but not in the manifest")


def _check_suite(manifest: Mapping[str, Any]) -> None:
    version = manifest["suite"]["version"]
    if version != suite.__version__:
        raise Rejected(f"made by suite {version}; verify it with that version (this is {suite.__version__})")
    if manifest["suite"]["files"]["digest"] != suite_digest()["digest"]:
        raise Rejected(f"made by a modified suite {version}: its files' digest differs from this installed suite's")
    if list(manifest["registry"]["requirements"]) != list(REGISTRY):
        raise Rejected(f"the manifest's requirement IDs are not the registry of suite {version}")


def _check_run(manifest: Mapping[str, Any], results: Mapping[str, Any]) -> None:
    """The run was a complete certification run, and its verdicts follow from its own records."""
    for key in ("run_id", "started_at", "finished_at"):
        if manifest[key] != results[key]:
            raise Rejected(f"the manifest belongs to another run ({key} {manifest[key]} ≠ {results[key]})")
    options, settings = results["options"], manifest["settings"]
    if not options.get("certify") or not settings.get("certify"):
        raise Rejected("not a --certify run")
    completeness = Completeness.from_json(results["completeness"])
    if completeness.narrowed_by or settings.get("narrowed_by"):
        raise Rejected(f"the run was narrowed: {' '.join(completeness.narrowed_by or settings['narrowed_by'])}")
    budget = Budget(**settings["budget"])
    low = [k for k, v in budget.__dict__.items() if v < getattr(DEFAULT_BUDGET, k)]
    if completeness.reduced or low:
        raise Rejected(f"the run used reduced budgets: {', '.join(completeness.reduced or low)}")
    if options.get("faults") is not None or settings.get("faults") is not None:
        raise Rejected("the run went through the fault proxy")
    if completeness.not_run:
        raise Rejected(f"{len(completeness.not_run)} items did not run, e.g. {completeness.not_run[0]}")
    records = [Record.from_json(r) for r in results["checks"]]
    silent = sorted({r.test_id for r in records} ^ set(_registry_items()))
    if silent:
        raise Rejected(f"item {silent[0]} of the suite has no record in results.json")
    certified = results["target"]["certified_version"]
    rows = aggregate(records, int(certified.split(".")[1]))
    declared = {r["id"]: r["verdict"] for r in results["requirements"]}
    if list(declared) != list(REGISTRY):
        raise Rejected("results.json does not hold one verdict per requirement of the registry")
    for row in rows:
        if declared[row["id"]] != row["verdict"]:
            raise Rejected(f"{row['id']} is declared {declared[row['id']]} but its records say {row['verdict']}")
    capabilities = capability_ledger(results["target"].get("capabilities") or {}, records, int(certified.split(".")[1]))
    summary = summarize(rows, records, capabilities)
    verdict, _ = decide(summary, completeness, strict=bool(options.get("strict")))
    if verdict.value != results["summary"]["verdict"] or verdict.value != manifest["verdict"]:
        raise Rejected(
            f"the verdict is declared {results['summary']['verdict']} but the records make it {verdict.value}"
        )
    if verdict is not RunVerdict.CONFORMANT:
        raise Rejected(f"the run is {verdict.value}: {results['summary']['headline']}")
    unjudged = [r["id"] for r in rows if r["verdict"] != "not-applicable" and r["verdict"] not in CHECKED]
    if unjudged:
        raise Rejected(f"{unjudged[0]} has no verdict")


def _registry_items() -> list[str]:
    from .registry import entries

    return [e.test_id for e in entries()]


def _check_junit(folder: Path, results: Mapping[str, Any]) -> None:
    try:
        root = ET.parse(folder / "junit.xml").getroot()
    except ET.ParseError as exc:
        raise Rejected(f"junit.xml does not parse: {exc}") from None
    props = {p.get("name"): p.get("value") for p in root.iter("property")}
    if props.get("run_id") != results["run_id"] or props.get("verdict") != results["summary"]["verdict"]:
        raise Rejected("junit.xml is from another run or states another verdict")
    declared = {r["id"]: r["verdict"] for r in results["requirements"]}
    cases = {c.get("name"): c for c in root.iter("testcase")}
    if set(cases) != set(declared):
        raise Rejected("junit.xml does not hold one test case per requirement")
    for req_id, case in cases.items():
        failed = case.find("failure") is not None or case.find("error") is not None
        if failed != (declared[req_id] in ("failed", "error")):
            raise Rejected(f"junit.xml disagrees with results.json on {req_id}")


def _check_html(folder: Path, results: Mapping[str, Any]) -> None:
    page = (folder / "report.html").read_text(encoding="utf-8")
    for needle in (results["run_id"], f'id="badge">{html.escape(results["summary"]["verdict"])}<'):
        if needle not in page:
            raise Rejected("report.html is from another run or states another verdict")


def _check_signature(folder: Path, public_key: Path) -> str:
    envelope = _load(folder / ENVELOPE, "signature")
    try:
        key = load_public_key(public_key)
    except (OSError, ValueError) as exc:
        raise Rejected(f"--public-key {public_key}: {exc}") from None
    from cryptography.exceptions import InvalidSignature

    payload = base64.b64decode(envelope.get("payload", ""))
    signatures = envelope.get("signatures") or []
    good = False
    for entry in signatures:
        try:
            key.verify(base64.b64decode(entry.get("sig", "")), _pae(str(envelope.get("payloadType")), payload))
            good = True
        except (InvalidSignature, ValueError):
            continue
    if not good:
        raise Rejected(f"{ENVELOPE} is not signed by the key in {public_key}")
    if envelope.get("payloadType") != PAYLOAD_TYPE:
        raise Rejected(f"{ENVELOPE} carries {envelope.get('payloadType')!r}, not an in-toto Statement")
    if json.loads(payload) != _statement(folder):
        raise Rejected(f"the signed statement does not match the bundle's files ({ENVELOPE})")
    return _keyid(key)


def verify(folder: Path, public_key: Path | None = None) -> tuple[bool, str]:
    """Check a bundle; ``(True, line)`` for a valid certification of a CONFORMANT run, else ``(False, why)``."""
    try:
        manifest = _load(folder / MANIFEST, "manifest: not a --certify bundle")
        _schema_valid(manifest, "json/manifest.schema.json", MANIFEST)
        results = _load(folder / "results.json", "results.json")
        if manifest["run_id"] != results.get("run_id"):
            raise Rejected(f"the manifest is of run {manifest['run_id']}, the results of run {results.get('run_id')}")
        _check_files(folder, manifest)
        _schema_valid(results, "json/report.schema.json", "results.json")
        _check_suite(manifest)
        _check_run(manifest, results)
        _check_junit(folder, results)
        _check_html(folder, results)
        signed = ""
        if public_key is not None:
            signed = f", signed by key {_check_signature(folder, public_key)[:16]}"
        elif (folder / ENVELOPE).exists():
            signed = ", signature present but not checked (pass --public-key)"
    except Rejected as exc:
        return False, f"REJECTED: {folder}: {exc}"
    s = results["summary"]
    return True, (
        f"VERIFIED: {folder}: {s['verdict']} — {results['target']['description']}, worker protocol "
        f"{results['target']['certified_version']}, {s['checked']} of {s['applicable']} requirements checked, "
        f"{len(manifest['files'])} files, suite {manifest['suite']['version']}, run {manifest['run_id']}{signed}"
    )


# -- the command line ----------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m suite.certify",
        description="Verify a --certify bundle (reports/<run-id>/), or write a signing key pair.",
        epilog="verify exits 0 when the bundle certifies a CONFORMANT run, 1 otherwise; 2 on bad usage.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    check = sub.add_parser("verify", help="re-check a bundle: hashes, schemas, completeness, verdicts, signature")
    check.add_argument("bundle", type=Path, metavar="DIR")
    check.add_argument("--public-key", type=Path, default=None, metavar="FILE", help="Ed25519 public key (PEM)")
    gen = sub.add_parser("keygen", help="write an Ed25519 key pair: PATH (private) and PATH.pub")
    gen.add_argument("path", type=Path, metavar="PATH")
    args = parser.parse_args(argv)
    if args.command == "keygen":
        try:
            private, public = keygen(args.path)
        except OSError as exc:
            print(f"keygen: {exc}", file=sys.stderr)
            return 1
        print(f"wrote {private} (private, keep it secret; pytest --certify --sign-key {private}) and {public}")
        return 0
    ok, line = verify(args.bundle, args.public_key)
    print(line)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
