#!/bin/sh
# What the device tests need (`make test` runs this): Debian's qemu-user-static and
# openssh-server, and the emulated aarch64 board built once per user. Where this machine
# does not allow the apt-get steps (not root, no apt), it says so and the tests skip,
# each naming what is missing.
orchestrator="$1"
need=""
command -v qemu-aarch64-static >/dev/null 2>&1 || need="$need qemu-user-static"
[ -x /usr/sbin/sshd ] || need="$need openssh-server"
if [ -n "$need" ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "device tests: apt-get install$need"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q $need >/dev/null || {
      apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q $need >/dev/null; }
  else
    echo "device tests: cannot install$need here (needs root and apt-get): they will skip"
    exit 0
  fi
fi
board="${ORCHESTRATOR_BOARDS:-$HOME/.cache/orchestrator/boards}/aarch64"
if [ ! -f "$board/board.json" ]; then
  "$orchestrator" device prepare 'qemu://aarch64' ||
    echo "device tests: the emulated board could not be built: they will skip"
fi
exit 0
