# Two commands on a fresh machine:  make demo  |  make test
# Both create the virtualenv, install the project and Debian's ZooKeeper when missing.

VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | md5sum | cut -c1-8)
SHELL := /bin/bash
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
EXTRAS ?= test,local,plots,spark,connect,faust,docs

.PHONY: setup zookeeper zookeeper-next netns-tools chromium test test-unit test-long soak typecheck demo experiments bench bench-spark lint clean chaos peer-venv docs docs-serve

setup: $(STAMP) zookeeper

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -e '.[$(EXTRAS)]'
	rm -f $(VENV)/.installed-*; touch $@

zookeeper:
	@test -f /usr/share/java/zookeeper.jar || \
	  ($(SUDO) apt-get install -y -qq zookeeper || \
	   ($(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq zookeeper))
	@command -v java >/dev/null || $(SUDO) apt-get install -y -qq default-jre-headless

# A current ZooKeeper for the chaos checker's partition runs: Debian 12's 3.8.0 can forget acknowledged writes
# when a server rejoins (ZOOKEEPER-4785, -4646, fixed in 3.8.4 / 3.9.2; 3.9.3 has ZOOKEEPER-4925, fixed in
# 3.9.4), so the checker runs Debian testing's server jar (the current libzookeeper-java, checked against the
# archive's SHA-256) on Debian 12's libraries. Unpacked into .zk/.
ZK_NEXT := .zk/usr/share/java/zookeeper.jar
DEBIAN_NEXT := http://deb.debian.org/debian
zookeeper-next: zookeeper
	@test -f $(ZK_NEXT) || { set -e; mkdir -p .zk; \
	  entry=$$(curl -fsSL $(DEBIAN_NEXT)/dists/testing/main/binary-all/Packages.xz | xz -dc | \
	    awk '/^Package: /{p=($$2=="libzookeeper-java")} p&&/^Filename: /{f=$$2} p&&/^SHA256: /{print f, $$2; exit}'); \
	  test -n "$$entry"; set -- $$entry; curl -fsSL -o .zk/zk.deb $(DEBIAN_NEXT)/$$1; \
	  echo "$$2  .zk/zk.deb" | sha256sum -c --quiet; dpkg-deb -x .zk/zk.deb .zk; rm .zk/zk.deb; }
	@echo "ZooKeeper $$(basename $$(readlink $(ZK_NEXT)) .jar | cut -d- -f2) in .zk (ALIGNER_ZOOKEEPER_JAR=$(ZK_NEXT))"

# The partition tests' tools: network namespaces, veths and a bridge (iproute2), cuts (nftables).
netns-tools:
	@command -v nft >/dev/null && command -v ip >/dev/null || \
	  ($(SUDO) apt-get install -y -qq iproute2 nftables || \
	   ($(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq iproute2 nftables))

# The real browser of the console's tests: Debian's Chromium, driven by Playwright (never its own browser download).
chromium:
	@test -x /usr/bin/chromium || \
	  ($(SUDO) apt-get install -y -qq chromium || \
	   ($(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq chromium))

# The whole suite but its long forms: ruff, mypy, then every test against the real embedded stack (about 35 minutes
# on 2 cores; the slowest forms, which repeat what it covers, are in test-long).
# A crash in a C extension prints every thread's stack; the crashing thread's is printed again at the end,
# where a log cut in the middle still shows it.
test: setup chromium netns-tools typecheck
	$(VENV)/bin/ruff check .
	@set -o pipefail; $(PY) -m pytest -q -ra --durations=40 -m "not long" 2>&1 | tee .pytest-last.log || \
	  { rc=$$?; [ $$rc -lt 128 ] || { echo "pytest died of signal $$((rc - 128)); the thread it died in:"; \
	    grep -q '^Current thread' .pytest-last.log && sed -n '/^Current thread/,/^$$/p' .pytest-last.log | head -80 \
	    || echo "  one with no Python frames (a C library's own thread)"; }; exit $$rc; }

# The pure tests only (protocol machines and their properties, models, layers, codecs): no stack, under a minute.
test-unit: setup
	$(VENV)/bin/ruff check .
	$(PY) -m pytest -q -m "not stack"

# The long forms (not in make test): the tests marked long (about 25 minutes, listed in README), then the
# compressed soak, 15 minutes of the chaos chain at 0.05 s epochs with a fault every ~30 s, a hot-swap every
# 5 minutes and the coordinator's retention loop every 30 s (2 minutes kept).
test-long: setup
	$(PY) -m pytest -q -ra --durations=20 -m long
	$(PY) -m experiments.soak --minutes 15 --interval 0.05 --sample 30 --swap-every 300 \
	  --retention-every 30 --keep-epochs 1 --keep-seconds 120 --window 120

# The peer of bench_pipeline (Quix Streams, exactly-once and at-least-once) in a virtual environment of its own:
# its pins are not ours. bench_pipeline runs it whenever this exists.
PEER_VENV := experiments/.peer-venv
peer-venv: $(PEER_VENV)/.installed
$(PEER_VENV)/.installed:
	python3 -m venv $(PEER_VENV)
	$(PEER_VENV)/bin/pip install -q "quixstreams==3.28.1"
	touch $@

# The soak (SOAK_MINUTES, default 120): curves and verdict in experiments/results/soak/.
SOAK_MINUTES ?= 120
soak: setup
	SOAK_MINUTES=$(SOAK_MINUTES) $(PY) -m experiments.soak --sample 60 --window 600 \
	  --retention-every 60 --keep-epochs 1000 --keep-seconds 600

# Every import of the library resolved (the three roots of the namespace package `aligner`, see pyproject.toml),
# and the benchmarks, the demo and the tests, so that one the library's change breaks fails here, not when next run.
typecheck: setup
	$(VENV)/bin/mypy -p aligner -p aligner.connectors -p aligner.coordinator -p aligner.embedded
	$(VENV)/bin/mypy experiments tests

# CONSOLE: the port of `aligner console` while the demo runs (0: none).
CONSOLE ?= 8080
demo: setup
	$(PY) -m experiments.demo --console-port $(CONSOLE)

experiments: setup
	$(PY) -m experiments.suite all

# Chaos runs of the chain under a seeded nemesis (reports and timelines in experiments/results/chaos).
CHAOS_ARGS ?= --runs 10 --faults 50
chaos: setup zookeeper-next
	$(PY) -m experiments.chaos $(CHAOS_ARGS)

bench: setup
	$(PY) -m experiments.bench_sink
	$(PY) -m experiments.bench_zk_ops
	$(PY) -m experiments.bench_reader

# The Spark benchmarks (about 10 and 6 minutes).
bench-spark: setup
	$(PY) -m experiments.bench_spark_hop --minutes 10
	$(PY) -m experiments.bench_spark_swap --swaps 3

# The docs site (MkDocs Material) into site/, strictly: a broken link or reference fails. make test builds it too
# (tests/platform/test_docs.py). The CLI reference runs the `typer` command of the virtualenv.
DOCS_ENV := PATH=$(CURDIR)/$(VENV)/bin:$$PATH NO_MKDOCS_2_WARNING=1
docs: setup
	$(DOCS_ENV) $(PY) -m mkdocs build --strict

docs-serve: setup
	$(DOCS_ENV) $(PY) -m mkdocs serve

lint: setup
	$(VENV)/bin/ruff check .

clean:
	rm -rf $(VENV) .pytest_cache experiments/results site
