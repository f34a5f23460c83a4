"""Certification bundles that anyone can verify, and their optional signature.

A ``--certify`` run writes ``reports/<run-id>/manifest.json`` beside its reports: the sha256 of every file of
the run (``results.json``, ``junit.xml``, ``report.html``, the recorded exchanges of replay bundles), the suite
version and a digest of the installed suite's own files, the registry's requirement IDs, the target's
discovery document, the command line and options, start and finish in UTC, Python and platform. With
``--sign-key`` it also writes ``manifest.intoto.json``: an in-toto Statement (subject: every file of the
bundle by digest, predicate: the manifest) in a DSSE envelope signed with Ed25519.

``python -m suite.certify verify DIR [--public-key FILE] [--allow-unsigned]`` (also ``dw-certify verify``)
re-checks all of it — the hashes, the JSON schemas, the suite build, the registry, the completeness of the run,
the verdicts re-derived from the run's own records, the junit and HTML files against the results, the same
target and run named by every file, the signature — and prints one line: ``VERIFIED: signed by <fingerprint>``
(exit 0), ``UNSIGNED`` (exit 3, or 0 with ``--allow-unsigned``: anyone could have made it) or ``REJECTED``
(exit 1). ``reproduce DIR --target URL`` runs the recorded run again against a live target and compares every
requirement's verdict (:mod:`suite.reproduce`). ``keygen PATH`` writes an Ed25519 key pair (``PATH``,
``PATH.pub``).
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import html
import json
import os
import platform
import shlex
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any
from xml.etree import ElementTree as ET

import schemas
import suite
from suite.protocol.requirements import REGISTRY

from .build import describe, install_hint, same_build, sha256_file, suite_build, suite_digest
from .keys import keygen, load_private_key, load_public_key
from .outcomes import Record, RunVerdict
from .results import CHECKED, Completeness, aggregate, capability_ledger, decide, document_matrix, summarize
from .settings import DEFAULT_BUDGET, Budget
from .text import plural

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

    from .context import TargetInfo
    from .settings import RunSettings

__all__ = [
    "ENVELOPE",
    "MANIFEST",
    "PUBLIC_KEY",
    "Verification",
    "build_mismatch",
    "certification",
    "certification_lines",
    "fingerprint",
    "key_fingerprint",
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
PUBLIC_KEY = "manifest.pub"
# verify's exit statuses: a signed valid certification, a rejected bundle, a valid bundle no one signed.
EXIT_VERIFIED, EXIT_REJECTED, EXIT_UNSIGNED = 0, 1, 3
MANIFEST_SCHEMA = "durable-workflow.conformance-manifest.v1"
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://durable-workflow.dev/conformance/manifest/v1"
PAYLOAD_TYPE = "application/vnd.in-toto+json"
REQUIRED_FILES = ("results.json", "junit.xml", "report.html")


# -- digests ---------------------------------------------------------------------------------------------------


def _bundle_files(folder: Path) -> Iterator[Path]:
    for path in sorted(folder.rglob("*")):
        if path.is_file() and path.relative_to(folder).as_posix() not in (MANIFEST, ENVELOPE, PUBLIC_KEY):
            yield path


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
        {"path": p.relative_to(out_dir).as_posix(), "sha256": sha256_file(p), "bytes": p.stat().st_size}
        for p in _bundle_files(out_dir)
    ]
    manifest = {
        "schema": MANIFEST_SCHEMA,
        "run_id": results["run_id"],
        "verdict": results["summary"]["verdict"],
        "headline": results["summary"]["headline"],
        "started_at": results["started_at"],
        "finished_at": results["finished_at"],
        "suite": results.get("suite_build") or suite_build(),
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
        key = load_private_key(Path(sign_key))
        envelope = sign(out_dir, key)
        (out_dir / ENVELOPE).write_text(json.dumps(envelope, indent=2), encoding="utf-8")
        # The signer's public key beside the signature, so anyone can check it and compare its fingerprint with
        # the one the signer publishes; a forger's own key shows as another fingerprint.
        (out_dir / PUBLIC_KEY).write_bytes(_public_pem(key.public_key()))
    return path


# -- signing (DSSE over an in-toto Statement) -----------------------------------------------------------------


def _pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE's pre-authentication encoding: what is signed, so the payload type cannot be swapped."""
    kind = payload_type.encode()
    return b"DSSEv1 %d %s %d %s" % (len(kind), kind, len(payload), payload)


def _keyid(public: Ed25519PublicKey) -> str:
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    return hashlib.sha256(public.public_bytes(Encoding.Raw, PublicFormat.Raw)).hexdigest()


def fingerprint(public: Ed25519PublicKey) -> str:
    """``ed25519:<sha256 of the raw public key>``: the envelope's keyid, as a signer publishes it."""
    return f"ed25519:{_keyid(public)}"


def key_fingerprint(private_key_path: Path) -> str:
    """The fingerprint of the public half of the private key at ``private_key_path``."""
    return fingerprint(load_private_key(private_key_path).public_key())


def _public_pem(public: Ed25519PublicKey) -> bytes:
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    return public.public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo)


def _statement(out_dir: Path) -> dict[str, Any]:
    manifest = json.loads((out_dir / MANIFEST).read_text(encoding="utf-8"))
    subjects = [{"name": f["path"], "digest": {"sha256": f["sha256"]}} for f in manifest["files"]]
    subjects.append({"name": MANIFEST, "digest": {"sha256": sha256_file(out_dir / MANIFEST)}})
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
        if sha256_file(path) != entry["sha256"]:
            raise Rejected(f"{rel} was changed after the run: its sha256 does not match the manifest")
    extra = [p.relative_to(folder).as_posix() for p in _bundle_files(folder)]
    unlisted = sorted(set(extra) - set(listed))
    if unlisted:
        raise Rejected(f"{unlisted[0]} is in the bundle but not in the manifest")


def build_mismatch(recorded: Mapping[str, Any]) -> str | None:
    """Why the installed suite is not the build that made a bundle, with the build to install (``None``: same)."""
    installed = suite_build()
    if same_build(dict(recorded), installed):
        return None
    return f"made by {describe(dict(recorded))}; this is {describe(installed)}: {install_hint(dict(recorded))}"


def _check_suite(manifest: Mapping[str, Any]) -> None:
    mismatch = build_mismatch(manifest["suite"])
    if mismatch is not None:
        raise Rejected(mismatch)
    if list(manifest["registry"]["requirements"]) != list(REGISTRY):
        raise Rejected(f"the manifest's requirement IDs are not the registry of {describe(manifest['suite'])}")


def recorded_target(command: str) -> str | None:
    """The ``--target`` of a recorded command line (``None``: not on it, e.g. given by the environment)."""
    try:
        args = shlex.split(command)
    except ValueError:
        return None
    for i, arg in enumerate(args):
        if arg.startswith("--target="):
            return arg.split("=", 1)[1]
        if arg == "--target" and i + 1 < len(args):
            return args[i + 1]
    return None


def _check_same_target(folder: Path, manifest: Mapping[str, Any], results: Mapping[str, Any]) -> None:
    """Every file of the bundle names the same target and run: a relabelled bundle shows where its edits
    stopped, and the recorded command line must have been run against the target the results name."""
    t = results["target"]
    url, description = str(t["url"]).rstrip("/"), t["description"]

    def named(value: Any) -> bool:
        text = str(value).rstrip("/")
        return text == url or (text == "embedded" and bool(t.get("embedded")))

    claims: list[tuple[str, str, Any]] = [
        (MANIFEST, "target URL", manifest["target"]["url"]),
        (MANIFEST, "target option", manifest["options"].get("target")),
        (MANIFEST, "settings' target", manifest["settings"].get("target")),
        ("results.json", "target option", results["options"].get("target")),
    ]
    for name, command in ((MANIFEST, manifest.get("command", "")), ("results.json", results.get("command", ""))):
        on_line = recorded_target(str(command))
        if on_line is not None:
            claims.append((name, "command line's --target", on_line))
    for name, what, value in claims:
        if value is not None and not named(value):
            raise Rejected(f"{name} names another target ({what} {value}) than results.json ({url})")
    if manifest["target"]["description"] != description:
        raise Rejected(f"{MANIFEST} names another target ({manifest['target']['description']}) than results.json")
    if manifest.get("command", "") != results.get("command", ""):
        raise Rejected(f"{MANIFEST} records another command line than results.json")
    props = _junit_properties(folder)
    if props.get("target") != description or (props.get("target_url") or "").rstrip("/") != url:
        raise Rejected(f"junit.xml names another target ({props.get('target_url') or props.get('target')})")
    page = (folder / "report.html").read_text(encoding="utf-8")
    for value in (description, results.get("command") or "not recorded"):
        if f"<code>{html.escape(str(value))}</code>" not in page:
            raise Rejected(f"report.html names another target or command line than results.json ({value})")


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
        raise Rejected(f"{plural(len(completeness.not_run), 'item')} did not run, e.g. {completeness.not_run[0]}")
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
    summary = summarize(rows, records, capabilities, document_matrix(results))
    # A bundle is a certification: it must have reached every applicable coverage cell, whatever its run says.
    verdict, _ = decide(summary, replace(completeness, certify=True), strict=bool(options.get("strict")))
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


def _junit(folder: Path) -> ET.Element:
    try:
        return ET.parse(folder / "junit.xml").getroot()
    except ET.ParseError as exc:
        raise Rejected(f"junit.xml does not parse: {exc}") from None


def _junit_properties(folder: Path) -> dict[str | None, str | None]:
    return {p.get("name"): p.get("value") for p in _junit(folder).iter("property")}


def _check_junit(folder: Path, results: Mapping[str, Any]) -> None:
    root = _junit(folder)
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


def _check_signature(folder: Path, public_key: Path | None) -> str:
    """The fingerprint of the key that signed the bundle: ``public_key`` when given (the signer's published
    key), else the one the bundle carries, whose fingerprint the reader compares with the signer's."""
    envelope = _load(folder / ENVELOPE, "signature")
    key_path = public_key if public_key is not None else folder / PUBLIC_KEY
    if public_key is None and not key_path.exists():
        raise Rejected(f"{ENVELOPE} is signed but the bundle has no {PUBLIC_KEY}; pass the signer's --public-key")
    try:
        key = load_public_key(key_path)
    except (OSError, ValueError) as exc:
        raise Rejected(f"{'--public-key ' if public_key else ''}{key_path}: {exc}") from None
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
        raise Rejected(f"{ENVELOPE} is not signed by the key in {key_path}")
    if envelope.get("payloadType") != PAYLOAD_TYPE:
        raise Rejected(f"{ENVELOPE} carries {envelope.get('payloadType')!r}, not an in-toto Statement")
    if json.loads(payload) != _statement(folder):
        raise Rejected(f"the signed statement does not match the bundle's files ({ENVELOPE})")
    return fingerprint(key)


@dataclass(frozen=True)
class Verification:
    """What ``verify`` found: ``verified`` (valid and signed), ``unsigned`` (valid, but anyone could have made
    it) or ``rejected``, with the one line it prints."""

    status: str
    line: str

    @property
    def ok(self) -> bool:
        return self.status == "verified"

    def exit_code(self, *, allow_unsigned: bool = False) -> int:
        if self.status == "verified" or (self.status == "unsigned" and allow_unsigned):
            return EXIT_VERIFIED
        return EXIT_UNSIGNED if self.status == "unsigned" else EXIT_REJECTED


def verify(folder: Path, public_key: Path | None = None) -> Verification:
    """Check a bundle: a valid certification of a CONFORMANT run, signed (``verified``) or not (``unsigned``),
    else ``rejected`` with the first reason."""
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
        _check_same_target(folder, manifest, results)
        signer = None
        if (folder / ENVELOPE).exists():
            signer = _check_signature(folder, public_key)
        elif public_key is not None:
            raise Rejected(f"the bundle is not signed ({ENVELOPE} is missing), so no key can have signed it")
    except Rejected as exc:
        return Verification("rejected", f"REJECTED: {folder}: {exc}")
    s = results["summary"]
    what = (
        f"{s['verdict']} — {results['target']['description']}, worker protocol "
        f"{results['target']['certified_version']}, {s['checked']} of {plural(s['applicable'], 'requirement')} "
        f"checked, {plural(len(manifest['files']), 'file')}, {describe(manifest['suite'])}, run {manifest['run_id']}"
    )
    if signer is None:
        return Verification(
            "unsigned",
            f"UNSIGNED: {folder}: {what}; the files agree with each other, but the bundle is unsigned: anyone "
            f"could have produced it, this target's name included (dw-certify reproduce {folder} --target URL "
            "checks the claim against the server)",
        )
    whose = "" if public_key is not None else f" (the key in {PUBLIC_KEY}: compare it with the signer's published one)"
    return Verification("verified", f"VERIFIED: signed by {signer}{whose}: {folder}: {what}")


def certification(settings: RunSettings) -> dict[str, Any]:
    """Whether the run certifies, and the fingerprint of the key that signs its bundle (report.html shows it)."""
    fp = key_fingerprint(Path(settings.sign_key)) if settings.certify and settings.sign_key is not None else None
    return {"certify": settings.certify, "signed": fp is not None, "key_fingerprint": fp}


def certification_lines(out_dir: Path, results: Mapping[str, Any], sign_key: str | None = None) -> list[str]:
    """The end of a ``--certify`` run: where its bundle is, whether and by which key it is signed, and the
    command that verifies it (with the public key keygen wrote beside ``sign_key``, when it is there)."""
    cert = results.get("certification") or {}
    lines = [f"certification bundle: {out_dir / MANIFEST}"]
    fp = cert.get("key_fingerprint")
    if fp:
        public = Path(f"{sign_key}.pub") if sign_key else None
        shown = shlex.quote(str(public)) if public is not None and public.is_file() else "SIGNER-KEY.pub"
        lines.append(f"  signed by {fp} ({ENVELOPE}; publish this fingerprint so others can check it)")
        lines.append(f"  verify: dw-certify verify {shlex.quote(str(out_dir))} --public-key {shown}")
    else:
        lines.append("  unsigned: anyone could have produced such a bundle (--sign-key KEY signs it)")
        lines.append(f"  verify: dw-certify verify {shlex.quote(str(out_dir))} --allow-unsigned")
    return lines


# -- the command line ----------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m suite.certify",
        description="Verify a --certify bundle (reports/<run-id>/), reproduce a recorded run against a live target, "
        "or write a signing key pair.",
        epilog="verify exits 0 for a signed valid certification of a CONFORMANT run, 3 for a valid unsigned one "
        "(0 with --allow-unsigned), 1 otherwise; reproduce exits 0 when every verdict agrees, 1 when one differs, "
        "4 when the run cannot be reproduced here, 10 when the new run ended without results; 2 on bad usage.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    check = sub.add_parser("verify", help="re-check a bundle: hashes, schemas, completeness, verdicts, signature")
    check.add_argument("bundle", type=Path, metavar="DIR")
    check.add_argument(
        "--public-key",
        type=Path,
        default=None,
        metavar="FILE",
        help="the signer's Ed25519 public key (PEM); without it, the key the bundle carries, shown by fingerprint",
    )
    check.add_argument(
        "--allow-unsigned",
        action="store_true",
        help="exit 0 for a valid unsigned bundle too (its line still says it is unsigned)",
    )
    again = sub.add_parser(
        "reproduce",
        help="run a bundle's recorded run again against a live target and compare every requirement's verdict",
    )
    again.add_argument("bundle", type=Path, metavar="DIR", help="a --certify bundle or any run's report directory")
    again.add_argument("--target", required=True, metavar="URL", help="the live target to run against")
    for option, env in (
        ("--worker-token", "DW_WORKER_TOKEN"),
        ("--operator-token", "DW_OPERATOR_TOKEN"),
        ("--auth-token", "DW_AUTH_TOKEN"),
    ):
        again.add_argument(option, default=os.environ.get(env), metavar="TOKEN", help=f"default: ${env}")
    again.add_argument("--restart-command", default=None, metavar="CMD", help="as the recorded run had one")
    again.add_argument("--report-dir", type=Path, default=None, metavar="DIR", help="keep the new run's reports")
    gen = sub.add_parser("keygen", help="write an Ed25519 key pair: PATH (private) and PATH.pub")
    gen.add_argument("path", type=Path, metavar="PATH")
    args = parser.parse_args(argv)
    if args.command == "keygen":
        try:
            private, public = keygen(args.path)
        except OSError as exc:
            print(f"keygen: {exc}", file=sys.stderr)
            return 1
        print(
            f"wrote {private} (private, keep it secret; pytest --certify --sign-key {private}) and {public} "
            f"(fingerprint {key_fingerprint(private)})"
        )
        return 0
    if args.command == "reproduce":
        from .reproduce import reproduce

        tokens = {
            "DW_WORKER_TOKEN": args.worker_token,
            "DW_OPERATOR_TOKEN": args.operator_token,
            "DW_AUTH_TOKEN": args.auth_token,
        }
        return reproduce(
            args.bundle, args.target, tokens, restart_command=args.restart_command, report_dir=args.report_dir
        )
    outcome = verify(args.bundle, args.public_key)
    print(outcome.line)
    return outcome.exit_code(allow_unsigned=args.allow_unsigned)


if __name__ == "__main__":
    raise SystemExit(main())
