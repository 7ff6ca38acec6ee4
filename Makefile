# The two set-up commands the README promises; each works on a fresh machine.
PYTHON ?= python3
PORT ?= 8000

.PHONY: serve test typecheck install install-test models system-packages deploy-validators

# Install ferry and serve model_repo/ with the embedded broker.
serve: install models
	ferry serve --model-repository model_repo --http-port $(PORT)

# Install everything (system packages, ferry, test tools), check the types and run the whole suite.
test: system-packages install-test models deploy-validators typecheck
	$(PYTHON) -m pytest

# mypy as configured in pyproject.toml: strict on broker/ and workers/batching/.
typecheck: install-test
	$(PYTHON) -m mypy

# The embedding extra brings what the text-embedding demo needs to convert
# all-MiniLM-L6-v2 to ONNX at set-up.
install:
	$(PYTHON) -m pip install --quiet -e '.[embedding]'

install-test:
	$(PYTHON) -m pip install --quiet -e '.[test]'

# Generated model files that are not committed (all-MiniLM-L6-v2 as ONNX, its
# tokenizer); quick when already up to date.
models:
	$(PYTHON) model_repo/convert_minilm.py

# redis-server (and redis-cli, which joins the test Redis Cluster) and kcat for the broker tests,
# java 17 and Maven for the Kafka broker the tests assemble from Maven Central, espeak-ng to speak the speech tests' sentences; skipped when
# already present. chromium is the headless browser the dashboard test drives.
system-packages:
	@if ! command -v redis-server >/dev/null || ! command -v redis-cli >/dev/null || ! command -v kcat >/dev/null \
			|| ! command -v java >/dev/null || ! command -v mvn >/dev/null \
			|| ! command -v espeak-ng >/dev/null || ! command -v chromium >/dev/null; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
			redis-server redis-tools kcat openjdk-17-jre-headless maven espeak-ng chromium; \
	fi
	@# The deployment tests' validators: docker-compose (v1) runs `config` on compose.yaml, promtool
	@# (Debian's prometheus) checks Prometheus' config and the Grafana queries, npm fetches KEDA's schemas.
	@# npm alone: where a nodejs package already brings npm, Debian's npm package would conflict.
	@missing=""; \
	command -v docker-compose >/dev/null || missing="$$missing docker-compose"; \
	command -v promtool >/dev/null || missing="$$missing prometheus"; \
	command -v npm >/dev/null || missing="$$missing nodejs npm"; \
	if [ -n "$$missing" ]; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; \
	fi

# KEDA's ScaledObject schema for tests/deploy (@kubernetes-models/keda, pinned by its
# package-lock.json); reinstalled only when the lock file changes.
deploy-validators: tests/deploy/keda/node_modules/.package-lock.json

tests/deploy/keda/node_modules/.package-lock.json: tests/deploy/keda/package-lock.json
	npm ci --prefix tests/deploy/keda --no-audit --no-fund --silent
