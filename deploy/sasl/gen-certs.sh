#!/usr/bin/env bash
# A throwaway CA and the brokers' key and certificate (PEM) for docker-compose.sasl.yml, in deploy/sasl/certs/:
#   ca.pem    the CA that clients trust (ssl.ca.location)
#   kafka.pem the brokers' private key and certificate, for localhost, kafka, kafka-2 and kafka-3 (ssl.keystore.location)
# The broker containers read certs/ as another user than yours, so kafka.pem is readable by all: keep these for
# local stacks only. Run again to replace them (then restart the brokers).
set -euo pipefail
cd "$(dirname "$0")" && mkdir -p certs && cd certs
openssl req -x509 -newkey rsa:2048 -nodes -days 365 -subj "/CN=aligner-test-ca" -keyout ca.key -out ca.pem 2>/dev/null
openssl req -newkey rsa:2048 -nodes -subj "/CN=kafka" -keyout kafka.key -out kafka.csr 2>/dev/null
printf "subjectAltName=DNS:localhost,DNS:kafka,DNS:kafka-2,DNS:kafka-3,IP:127.0.0.1\n" > san.ext
openssl x509 -req -in kafka.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 365 -extfile san.ext \
    -out kafka.crt 2>/dev/null
cat kafka.key kafka.crt > kafka.pem
chmod 644 ca.pem kafka.pem
rm -f kafka.csr san.ext kafka.key kafka.crt ca.srl
echo "certificates in $(pwd)"
