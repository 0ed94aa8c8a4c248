#!/usr/bin/env bash
# The browser of the playground's browser tests (tests/e2e/test_playground_browser.py):
# Debian's chromium, driven by Playwright with executable_path set to it. `playwright
# install` would download Playwright's own build from a CDN, which machines without
# internet access (these among them) cannot reach; the distribution's package comes
# through the same mirror as every other package.
# Installs it when it is missing and this user may (root, or password-less sudo); else
# says why and leaves the tests to skip with the same sentence. Never fails the build.
set -u
for b in /usr/lib/chromium/chromium /usr/bin/chromium /usr/bin/chromium-browser; do
  [ -x "$b" ] && exit 0
done
command -v chromium >/dev/null 2>&1 && exit 0
if ! command -v apt-get >/dev/null 2>&1; then
  echo "note: no Chromium and no apt-get here: the playground's browser tests will be skipped;" \
       "install Chromium (a 'chromium' on PATH) to run them." >&2
  exit 0
fi
if [ "$(id -u)" -eq 0 ]; then
  SUDO=""
elif sudo -n true 2>/dev/null; then
  SUDO="sudo -n"
else
  echo "note: no Chromium, and installing it needs root: run" \
       "'sudo apt-get install -y --no-install-recommends chromium' to run the playground's browser tests." >&2
  exit 0
fi
echo "installing Chromium for the playground's browser tests (apt-get, about 15 s)"
if ! { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends chromium; }; then
  echo "note: apt-get could not install chromium: the playground's browser tests will be skipped." >&2
fi
exit 0
