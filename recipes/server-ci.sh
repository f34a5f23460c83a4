#!/usr/bin/env bash
# Server CI: run the Durable Workflow conformance suite against a server under test, on every change.
#
#   DW_SERVER_CMD="./my-server --port 8080 --test-profile" recipes/server-ci.sh [pytest options…]
#
# Copy this script into the server's repository as it is: every setting is an environment variable below, and
# no line of the script needs changing (the lines to change are in the job that calls it, marked "CHANGE ME").
# The steps, in order — the same as the GitHub Actions job in recipes/github-actions.yml and the composite action
# action.yml, which call this script:
#   1. install the suite into a virtualenv of its own: by default its package, dw-conformance, at the release
#      this script names (SUITE_RELEASE below), from the package index pip is configured with; DW_SUITE names
#      another (never the repository this script was copied into, unless DW_SUITE names it);
#   2. start the server under test (DW_SERVER_CMD, run by bash; its output goes to DW_REPORTS/server.log);
#   3. wait until the server it started holds DW_TARGET's port (its process or a descendant, and nothing
#      else, holds every socket listening there: Linux /proc, elsewhere lsof) and answers GET /api/health (at
#      most DW_START_TIMEOUT seconds; a server that exits first, or a port held by another process, ends the
#      job at once);
#   4. run the suite against it, failures first, from an empty directory (no project configuration applies),
#      one process so that a target's test clock can be used; the options given to this script go to pytest;
#   5. leave the reports in DW_REPORTS (keep them as the job's artifacts), say the verdict and stop the server.
#
# Settings (environment):
#   DW_SERVER_CMD     the command that starts the server under test with its test profile (required)
#   DW_TARGET         the URL it serves (default http://127.0.0.1:8080)
#   DW_SUITE          what to install (default: SUITE_RELEASE, the pip requirement dw-conformance==<release>):
#                     a pip requirement, a wheel file (dw_conformance-<release>-py3-none-any.whl), or a
#                     directory holding a checkout of the suite, whose wheel is built first
#   DW_SUITE_VENV     the suite's virtualenv (default .dw-suite-venv, created when missing)
#   DW_REPORTS        where the reports go (default dw-reports)
#   DW_START_TIMEOUT  seconds to wait for the server (default 60)
#   DW_CERTIFY        true: a certification run (--certify); false or empty: a CI gate (default)
#   DW_SIGN_KEY       a private key file (from dw-certify keygen): the certification bundle is signed with it
#                     (--sign-key; needs DW_CERTIFY=true)
#   DW_RESTART_CMD    the suite's --restart-command: kills the server hard and starts it again on the same
#                     URL and state, returning once it answers (default: this job's own — SIGKILL to the
#                     server's process tree, then DW_SERVER_CMD again, waited for as in step 3)
#   DW_WORKER_TOKEN, DW_OPERATOR_TOKEN, DW_AUTH_TOKEN   the server's credentials (role tokens, full-access
#                     token); the suite reads them from the environment, and without them the auth
#                     requirements are not covered
#
# It ends with the line "server-ci: verdict V (exit status N); reports in DIR", and when GITHUB_OUTPUT names a
# file (a GitHub Actions step) it appends verdict=V, exit-status=N and reports=DIR to it. V is the run verdict
# of results.json (CONFORMANT, NOT CONFORMANT, INCOMPLETE, HARNESS ERROR); without one, USAGE ERROR (exit 4),
# HARNESS ERROR (10), SERVER NOT STARTED (3), SETTINGS ERROR (2).
#
# Exit status: the suite's own — 0 CONFORMANT (or INCOMPLETE without --certify), 1 NOT CONFORMANT, 4 a bad
# option, 10 a harness error (the target could not be judged), 11 INCOMPLETE under --certify — so the job fails
# on NOT CONFORMANT; 3 when the server under test did not start; 2 when this script's settings are wrong.
set -euo pipefail

# The suite release this script was written for: its default DW_SUITE.
SUITE_RELEASE="dw-conformance==0.2.0.dev0"

# The verdict, said last, and for a GitHub Actions step as its outputs.
verdict_out() {
  echo "server-ci: verdict $1 (exit status $2); reports in ${3:-none}"
  if [[ -n "${GITHUB_OUTPUT:-}" ]]; then
    printf 'verdict=%s\nexit-status=%s\nreports=%s\n' "$1" "$2" "${3:-}" >>"$GITHUB_OUTPUT"
  fi
}

die() {
  echo "server-ci: $2" >&2
  case "$1" in
    2) verdict_out "SETTINGS ERROR" 2 "${reports:-}" ;;
    3) verdict_out "SERVER NOT STARTED" 3 "${reports:-}" ;;
  esac
  exit "$1"
}

[[ -n "${DW_SERVER_CMD:-}" ]] || die 2 "DW_SERVER_CMD is not set: the command that starts the server under test"
target="${DW_TARGET:-http://127.0.0.1:8080}"
[[ "$target" =~ ^https?://[^/]+ ]] || die 2 "DW_TARGET=$target is not an http(s) URL"
timeout="${DW_START_TIMEOUT:-60}"
[[ "$timeout" =~ ^[0-9]+$ && "$timeout" -ge 1 ]] || die 2 "DW_START_TIMEOUT=$timeout is not a whole number of seconds ≥ 1"
certify=()
case "${DW_CERTIFY:-}" in
  true) certify=(--certify) ;;
  false | "") ;;
  *) die 2 "DW_CERTIFY=$DW_CERTIFY is neither true nor false" ;;
esac
if [[ -n "${DW_SIGN_KEY:-}" ]]; then
  [[ -f "$DW_SIGN_KEY" ]] || die 2 "DW_SIGN_KEY=$DW_SIGN_KEY is not a file: give the private key from dw-certify keygen"
  [[ ${#certify[@]} -gt 0 ]] || die 2 "DW_SIGN_KEY is set without DW_CERTIFY=true: only a certification run is signed"
  certify+=(--sign-key="$(cd "$(dirname "$DW_SIGN_KEY")" && pwd)/$(basename "$DW_SIGN_KEY")")
fi
suite="${DW_SUITE:-$SUITE_RELEASE}"
if [[ -d "$suite" ]]; then
  [[ -f "$suite/pyproject.toml" ]] || die 2 "DW_SUITE=$suite is a directory without pyproject.toml, not a checkout of the suite"
fi
venv="${DW_SUITE_VENV:-.dw-suite-venv}"
reports="${DW_REPORTS:-dw-reports}"
mkdir -p "$reports"
reports="$(cd "$reports" && pwd)"

# 1. The suite: its release by default; a checkout only when DW_SUITE names one.
[[ -x "$venv/bin/python" ]] || python3 -m venv "$venv"
python="$(cd "$(dirname "$venv/bin/python")" && pwd)/python"
if [[ -d "$suite" ]]; then
  wheels="$(mktemp -d)"
  "$python" -m pip wheel --quiet --no-deps --wheel-dir "$wheels" "$suite"
  suite="$(ls "$wheels"/*.whl)"
fi
"$python" -m pip install --quiet "$suite"

# 2. The server under test, stopped whatever happens next (after a restart, the one the restart started).
bash -c "$DW_SERVER_CMD" >"$reports/server.log" 2>&1 &
server=$!
spec="$(mktemp -d)/restart.json"  # how to start it again; never among the reports (the command may hold tokens)
trap 'kill "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true; [[ ! -f "$spec" ]] || "$python" -m suite.processes stop "$spec"' EXIT

# 3. Wait until it answers.
# The job's own server, never whatever answers on the port: its process (or a descendant) must hold every
# socket listening there. A port another process holds ends the job at once.
"$python" -m suite.processes wait "$target" --pid "$server" --timeout "$timeout" \
  || die 3 "the server under test is not serving $target (see $reports/server.log)"

# 4. The suite, failures first, from an empty directory; its exit status is the job's. The restart checks kill
# the server and start it again: with DW_RESTART_CMD, or with this job's own restart of DW_SERVER_CMD.
restart="${DW_RESTART_CMD:-}"
if [[ -z "$restart" ]]; then
  restart="$("$python" -m suite.processes spec "$spec" --url "$target" --pid "$server" --log "$reports/server.log" \
    -- bash -c "$DW_SERVER_CMD")"
fi
run="$(mktemp -d)"
before="$(ls "$reports")"
status=0
(cd "$run" && "$python" -m pytest -p no:cacheprovider --target="$target" --report-dir="$reports" \
  --restart-command="$restart" ${certify[@]+"${certify[@]}"} "$@") || status=$?
echo "server-ci: suite exit status $status; reports in $reports"

# 5. The verdict: the one results.json of this run says, else what its exit status means.
written=""
for folder in "$reports"/*/; do
  name="$(basename "$folder")"
  if [[ -f "$folder/results.json" ]] && ! grep -qxF "$name" <<<"$before"; then
    written="$folder/results.json"
  fi
done
case "$status" in
  4) verdict="USAGE ERROR" ;;
  10) verdict="HARNESS ERROR" ;;
  *) verdict="NO VERDICT" ;;
esac
if [[ -n "$written" ]]; then
  verdict="$("$python" -c 'import json, sys; print(json.load(open(sys.argv[1]))["summary"]["verdict"])' "$written")"
fi
verdict_out "$verdict" "$status" "$reports"
exit "$status"
