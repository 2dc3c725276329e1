#!/usr/bin/env bash
# A command with a deadline that holds even when the command cannot be ended: a process blocked on a GPU kernel that
# never finishes outlives `timeout`'s signals, and a `wait` on it blocks the whole device call (issue 16, thirty-seventh
# session, call 4). The command runs in the background; this script polls it, and at the deadline sends SIGKILL to it
# and its children and returns 124 without waiting for them.
#   bash tools/deadline.sh 200 python3 -m pytest -m cuda tests/...   (exit status: the command's, or 124)
set -u
limit=${1:?usage: tools/deadline.sh SECONDS COMMAND...}
shift
"$@" &
pid=$!
for ((t = 0; t < limit * 10; ++t)); do
  kill -0 "$pid" 2>/dev/null || { wait "$pid"; exit $?; }
  sleep 0.1
done
echo "deadline: '$*' still running after $limit s: killed (SIGKILL), not waited for" >&2
pkill -KILL -P "$pid" 2>/dev/null
kill -KILL "$pid" 2>/dev/null
disown "$pid" 2>/dev/null
exit 124
