#!/bin/sh
# `pip install` for the images' build stages, with pip's settings from build arguments
# (PIP_INDEX_URL, PIP_EXTRA_INDEX_URL, PIP_FIND_LINKS, PIP_TRUSTED_HOST, PIP_CA_CERTS).
# An empty build argument is unset rather than handed to pip, which would take an empty
# PIP_INDEX_URL for an index. PIP_CA_CERTS holds PEM text (a mirror's or a TLS-inspecting
# proxy's CA): it is added to the system's CA bundle, which pip then uses (PIP_CERT). The
# bundle stays in the build stage; no runtime image carries these settings.
set -eu
for name in PIP_INDEX_URL PIP_EXTRA_INDEX_URL PIP_FIND_LINKS PIP_TRUSTED_HOST PIP_CERT; do
    eval "value=\${$name:-}"
    if [ -z "$value" ]; then
        unset "$name"
    fi
done
if [ -n "${PIP_CA_CERTS:-}" ]; then
    bundle=/tmp/weir-pip-ca.pem
    : >"$bundle"
    if [ -f /etc/ssl/certs/ca-certificates.crt ]; then
        cat /etc/ssl/certs/ca-certificates.crt >>"$bundle"
    fi
    printf '%s\n' "$PIP_CA_CERTS" >>"$bundle"
    export PIP_CERT="$bundle"
fi
unset PIP_CA_CERTS
exec /opt/weir/bin/python -m pip install --no-cache-dir --disable-pip-version-check "$@"
