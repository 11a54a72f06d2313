#!/usr/bin/env bash
# A throwaway CA and a broker certificate for localhost and kafka (PEM), for docker-compose.sasl.yml.
set -euo pipefail
cd "$(dirname "$0")" && mkdir -p certs && cd certs
openssl req -x509 -newkey rsa:2048 -nodes -days 365 -subj "/CN=aligner-test-ca" -keyout ca.key -out ca.pem
openssl req -newkey rsa:2048 -nodes -subj "/CN=kafka" -keyout kafka.keystore.key -out kafka.csr
printf "subjectAltName=DNS:localhost,DNS:kafka,IP:127.0.0.1\n" > san.ext
openssl x509 -req -in kafka.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 365 -extfile san.ext \
    -out kafka.keystore.pem
rm -f kafka.csr san.ext
echo "certificates in $(pwd)"
