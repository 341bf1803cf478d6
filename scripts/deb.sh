#!/bin/sh
# Builds the Debian package, target/debian/intact_VERSION-1_ARCH.deb: the release binary, and
# its man pages (one per verb) and shell completions generated from it, so they never drift from --help.
# Installs cargo-deb first where it is missing. INTACT_DEB_PROFILE=dev packages the debug
# build instead (the test suite does, to check the packaging without a release build).
# Arguments go to `cargo deb`.
set -eu
cd "$(dirname "$0")/.."
command -v cargo-deb >/dev/null 2>&1 || cargo install cargo-deb --version 3.8.0 --locked
profile=${INTACT_DEB_PROFILE:-release}
cargo build --profile "$profile" --locked
case "$profile" in
dev) bin=target/debug/intact ;;
*) bin=target/$profile/intact ;;
esac
out=target/assets
rm -rf "$out"
mkdir -p "$out"
mkdir "$out/man"
"$bin" generate man "$out/man"
gzip -9n "$out"/man/*.1
"$bin" generate bash >"$out/intact"
"$bin" generate zsh >"$out/_intact"
"$bin" generate fish >"$out/intact.fish"
cargo deb --no-build --profile "$profile" "$@"
