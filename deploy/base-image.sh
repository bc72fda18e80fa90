#!/usr/bin/env bash
# Make a base image for deploy/Dockerfile from Debian's packages, for machines
# that reach Debian's mirror and PyPI but no image registry:
#   deploy/base-image.sh [TAG]      (default jobq-base:bookworm)
#   docker build --network host --build-arg BASE=jobq-base:bookworm -f deploy/Dockerfile .
# Debian bookworm's python3 (3.11) and its venv module, CA certificates, no docs.
# The host's CA bundle is copied in and named for pip (PIP_CERT), so a build
# behind a TLS-inspecting proxy that the host trusts works the same inside.
set -euo pipefail
tag="${1:-jobq-base:bookworm}"
mmdebstrap --quiet --variant=minbase --include=python3,python3-venv,ca-certificates \
  --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
  --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-exclude=/usr/share/info/*' \
  --customize-hook='copy-in /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/' \
  --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*' \
  bookworm - \
  | docker import --change 'ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt' \
      --change 'CMD ["python3"]' - "$tag" >/dev/null
echo "$tag"
