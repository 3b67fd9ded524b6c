#!/usr/bin/env bash
# Downloads the WMT17 Chinese-English training data (News Commentary v12, UN v1.0 and CWMT need
# registration: place un/cwmt files in RAW_DIR/orig yourself; see http://statmt.org/wmt17/translation-task.html),
# and writes the dev (newsdev2017) and test (newstest2017) sets through sacrebleu.
# Usage: download_wmt17_zh_en.sh RAW_DIR      (needs network access; not run by the tests)
set -euo pipefail
RAW=${1:?usage: download_wmt17_zh_en.sh RAW_DIR}
mkdir -p "$RAW/orig" && cd "$RAW/orig"
wget -nc http://data.statmt.org/wmt17/translation-task/training-parallel-nc-v12.tgz
tar -xzf training-parallel-nc-v12.tgz
cd ..
cat orig/training/news-commentary-v12.zh-en.zh orig/*.zh-extra 2>/dev/null > train.zh || true
cat orig/training/news-commentary-v12.zh-en.en orig/*.en-extra 2>/dev/null > train.en || true
sacrebleu -t wmt17/dev -l zh-en --echo src > valid.zh
sacrebleu -t wmt17/dev -l zh-en --echo ref > valid.en
sacrebleu -t wmt17 -l zh-en --echo src > test.zh
sacrebleu -t wmt17 -l zh-en --echo ref > test.en
echo "now run: python examples/wmt/prepare_wmt.py --raw-dir $RAW --src zh --tgt en --out-dir DIR"
