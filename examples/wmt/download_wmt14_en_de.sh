#!/usr/bin/env bash
# Downloads the WMT14 English-German training data used by Dou et al. (2019) (about 4.5M pairs:
# Europarl v7, Common Crawl, News Commentary v9) and writes plain parallel files to RAW_DIR, then
# the dev (newstest2013) and test (newstest2014) sets through sacrebleu.
# Usage: download_wmt14_en_de.sh RAW_DIR      (needs network access; not run by the tests)
set -euo pipefail
RAW=${1:?usage: download_wmt14_en_de.sh RAW_DIR}
mkdir -p "$RAW/orig" && cd "$RAW/orig"
wget -nc http://statmt.org/wmt13/training-parallel-europarl-v7.tgz
wget -nc http://statmt.org/wmt13/training-parallel-commoncrawl.tgz
wget -nc http://statmt.org/wmt14/training-parallel-nc-v9.tgz
for f in *.tgz; do tar -xzf "$f"; done
cd ..
cat orig/training/europarl-v7.de-en.en orig/commoncrawl.de-en.en orig/training/news-commentary-v9.de-en.en > train.en
cat orig/training/europarl-v7.de-en.de orig/commoncrawl.de-en.de orig/training/news-commentary-v9.de-en.de > train.de
sacrebleu -t wmt13 -l en-de --echo src > valid.en
sacrebleu -t wmt13 -l en-de --echo ref > valid.de
sacrebleu -t wmt14/full -l en-de --echo src > test.en
sacrebleu -t wmt14/full -l en-de --echo ref > test.de
echo "now run: python examples/wmt/prepare_wmt.py --raw-dir $RAW --src en --tgt de --out-dir DIR"
