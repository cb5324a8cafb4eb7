#!/usr/bin/env bash
# Take the generated figures out of the working tree while a remote GPU call copies it, and put
# them back after. A call carries at most 64 MiB (tracked files included); the reports' and the
# results' PNGs are ~9 of the ~14 MiB tracked, and no device stage reads them. Slim, the tree is
# ~5 MiB, so FlashAttention-4's wheels travel in fewer calls (.fa4/small + .fa4/p1, then .fa4/p2:
# stages fa4-small fa4-part1, then fa4-big of tools/device_session.sh).
#
#   bash tools/device_slim.sh slim      # before the device calls (refuses if a copy is already out)
#   bash tools/device_slim.sh restore   # after them, before any commit
#
# While slim, `git status` shows the figures as deleted: commit with explicit paths only, never
# `git commit -a` or `git add -A`. The figures wait in $SLIM_DIR (default /tmp/moda-slim).
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${SLIM_DIR:-/tmp/moda-slim}
case ${1:-} in
  slim)
    [ -e "$DIR/figures.tar" ] && { echo "device_slim: $DIR/figures.tar exists: restore first" >&2; exit 2; }
    mkdir -p "$DIR"
    git ls-files -z 'reports/*.png' 'results/*.png' | tar --null -T - -cf "$DIR/figures.tar"
    git ls-files -z 'reports/*.png' 'results/*.png' | xargs -0 rm -f
    echo "slim: $(tar -tf "$DIR/figures.tar" | wc -l) figure files moved to $DIR/figures.tar" ;;
  restore)
    [ -e "$DIR/figures.tar" ] || { echo "device_slim: nothing to restore in $DIR" >&2; exit 2; }
    tar -xf "$DIR/figures.tar" && rm "$DIR/figures.tar"
    echo "restored; files still missing: $(git ls-files --deleted | wc -l)" ;;
  *) echo "usage: bash tools/device_slim.sh slim|restore" >&2; exit 2 ;;
esac
