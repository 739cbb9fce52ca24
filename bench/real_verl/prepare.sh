#!/usr/bin/env bash
# Run HERE (not on the GPU machine): bring what real verl 0.5.0.dev needs on the H200 into two
# ignored folders that `run` carries: .whl/ (cp312 wheels the GPU image lacks) and .verl_src/
# (verl's own package at commit 4c3310db, the newest with the HF rollout). See
# ../shared/docs/REAL_VERL.md for why each piece is needed.
#
#   bash bench/real_verl/prepare.sh            # from the repository root
#
# Needs network to PyPI and the `fetch` tool's mirror of verl at $VERL_GIT (default below).
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
# (verl moved from volcengine/verl to verl-project/verl: either mirror holds 4c3310db)
if [ -z "${VERL_GIT:-}" ]; then
  VERL_GIT=/work/.mirror/volcengine+verl/repo
  [ -d "$VERL_GIT" ] || VERL_GIT=/work/.mirror/verl-project+verl/repo
fi
VERL_COMMIT=${VERL_COMMIT:-4c3310db}
PY=${PY:-python3}

EXCLUDE=$(git rev-parse --git-path info/exclude)  # a worktree's .git is a file
mkdir -p "$(dirname "$EXCLUDE")"
for p in /.whl/ /.verl_src/ /.vm_snapshot/; do
  grep -qxF "$p" "$EXCLUDE" 2>/dev/null || echo "$p" >> "$EXCLUDE"
done
mkdir -p .whl
PLAT=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
      --platform manylinux1_x86_64 --platform manylinux_2_24_x86_64
      --platform manylinux_2_31_x86_64 --platform manylinux_2_34_x86_64)
# What the GPU image lacks for verl 4c3310db (its list: /work/.library/device/KINDS.md).
PKGS=(ray==2.49.2 hydra-core==1.3.8 omegaconf==2.3.0 tensordict==0.9.1 "pyvers<0.2"
      importlib-metadata codetiming orjson datasets==4.8.5 dill==0.4.1 multiprocess==0.70.19
      torchdata==0.11.0 jsonschema referencing rpds-py jsonschema-specifications
      py-spy bcrypt)
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp "${PLAT[@]}" -d .whl "${PKGS[@]}"

# antlr4-python3-runtime 4.9.* exists only as an sdist: build its (pure Python) wheel here.
ls .whl/antlr4_python3_runtime-*.whl >/dev/null 2>&1 || \
  "$PY" -m pip wheel -q --no-deps -w .whl "antlr4-python3-runtime==4.9.3"

# ray's Java worker (ray/jars/, ~31 MB) and RLlib (ray/rllib/, ~2 MB packed; verl imports
# only ray, ray.actor, ray.util, ray.experimental, ray._private) are not needed: drop them and
# their RECORD lines.
RAY=$(ls .whl/ray-2.49.2-*.whl)
if unzip -Z1 "$RAY" | grep -E '^ray/(jars|rllib)/' >/dev/null; then
  tmp=$(mktemp -d)
  (cd "$tmp" && unzip -q "$OLDPWD/$RAY" && rm -rf ray/jars ray/rllib \
     && sed -i -E '/^ray\/(jars|rllib)\//d' ray-2.49.2.dist-info/RECORD \
     && rm -f "$OLDPWD/$RAY" && zip -q -r -X "$OLDPWD/$RAY" .)
  rm -rf "$tmp"
fi

# verl's package at the pinned commit, plus the transformers-5 rename it needs.
rm -rf .verl_src && mkdir -p .verl_src
git --git-dir="$VERL_GIT" archive "$VERL_COMMIT" verl/ | tar -x -C .verl_src
grep -q '^0.5.0.dev' .verl_src/verl/version/version
grep -rl AutoModelForVision2Seq .verl_src/verl | xargs sed -i \
  's/AutoModelForVision2Seq/AutoModelForImageTextToText/g'
git --git-dir="$VERL_GIT" rev-parse "$VERL_COMMIT" > .verl_src/COMMIT

# the monitor as committed (HEAD): other work in progress in this tree does not travel
rm -rf .vm_snapshot && mkdir -p .vm_snapshot
git archive HEAD $(for d in monitor exporters cli; do git cat-file -e HEAD:$d 2>/dev/null \
  && echo $d; done) | tar -x -C .vm_snapshot
git rev-parse HEAD > .vm_snapshot/COMMIT

echo "wheels: $(du -sh .whl | cut -f1)  verl: $(du -sh .verl_src | cut -f1)"
tracked=$(git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
untracked=$(git ls-files -z --others --exclude-standard | xargs -0 -r du -cb 2>/dev/null \
            | tail -1 | cut -f1)
carried=$(du -cb .whl .verl_src .vm_snapshot | tail -1 | cut -f1)
total=$(( tracked + ${untracked:-0} + carried ))
echo "travels: tracked $((tracked>>20)) MiB + untracked $((${untracked:-0}>>20)) MiB" \
     "+ carried $((carried>>20)) MiB = $((total>>20)) MiB (limit 64)"
# 64 MiB is the limit; keep 3 MiB for files others add to the tree before the call
[ $((total>>20)) -lt 61 ] || { echo "too large to carry" >&2; exit 1; }
