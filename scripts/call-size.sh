# Sourced by scripts/gpu-prepare.sh and scripts/gpu-fa3.sh: how much one device call may carry.
# A call brings the working tree and its carried paths, 64 MiB at most; 512 KiB stay spare for the
# untracked files that travel too.
CALL_MAX_BYTES=$(( 64 * 1024 * 1024 - 512 * 1024 ))
# tree_bytes: the tracked files' size on disk, each rounded up to whole blocks: the device counted
# more than their bytes (session 45: 0.5.17's one-part kit, the patched files and a tree of 15.7 MB
# in bytes, 17.9 on disk, were refused at 63.4 MiB by bytes). A tracked file deleted in the work tree
# does not travel: du's complaint about it is not an error here.
tree_bytes() { (git ls-files -z | xargs -0 du -c --block-size=1 2>/dev/null || true) | tail -1 | cut -f1; }
