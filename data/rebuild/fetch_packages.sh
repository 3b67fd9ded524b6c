#!/usr/bin/env bash
# Downloads the Debian 12 (bookworm) packages that ship English and German text, and unpacks
# their data (text only) under WORKDIR/unpacked/PACKAGE. Needs apt-get with bookworm lists.
# Usage: data/rebuild/fetch_packages.sh WORKDIR
set -euo pipefail
WORK=${1:?usage: fetch_packages.sh WORKDIR}
PACKAGES=(
  libreoffice-help-en-us libreoffice-help-de libreoffice-l10n-de calibre trans-de-en
  gimp-help-en gimp-help-de debian-handbook manpages manpages-de manpages-dev
  wesnoth-1.16-data wesnoth-1.16-did wesnoth-1.16-dm wesnoth-1.16-dw wesnoth-1.16-ei wesnoth-1.16-httt
  wesnoth-1.16-l wesnoth-1.16-low wesnoth-1.16-nr wesnoth-1.16-sof wesnoth-1.16-sota wesnoth-1.16-sotbe
  wesnoth-1.16-thot wesnoth-1.16-trow wesnoth-1.16-tsg wesnoth-1.16-ttb wesnoth-1.16-utbs
  gimp-data inkscape gnucash-common gramps evolution-common evolution-data-server-common
  gnome-control-center-data nautilus-data libgtk-3-common libgtk-4-common gnome-shell-common gnumeric-common
  pidgin-data hexchat-common geany-common epiphany-browser-data meld gthumb-data shotwell-common darktable
  digikam-data kdenlive-data gcc-12-locales util-linux-locales postgresql-15 e2fsprogs-l10n aptitude-common
  gnupg-l10n freeciv-data vlc-l10n audacity-data filezilla-common poedit-common plasma-workspace-data
  kdepim-addons dolphin okular kate5-data marble-data grub-common binutils-common
  iso-codes git coreutils libc-l10n krb5-locales postgresql-client-15 libgtk2.0-common libglib2.0-data dpkg xkb-data
)
mkdir -p "$WORK/debs" "$WORK/unpacked"
(cd "$WORK/debs" && apt-get download "${PACKAGES[@]}")
for deb in "$WORK"/debs/*.deb; do
  name=$(basename "${deb%%_*}")
  mkdir -p "$WORK/unpacked/$name"
  # keep text: skip images, audio, fonts and binaries
  dpkg-deb --fsys-tarfile "$deb" | tar -x -C "$WORK/unpacked/$name" --wildcards \
    --exclude='*.png' --exclude='*.jpg' --exclude='*.gif' --exclude='*.svg' --exclude='*.ogg' \
    --exclude='*.wav' --exclude='*.ttf' --exclude='*.otf' --exclude='*.pdf' --exclude='*.so*'
done
ls "$WORK/debs" > "$WORK/package-versions.txt"
echo "unpacked $(ls "$WORK/unpacked" | wc -l) packages; versions in $WORK/package-versions.txt"
