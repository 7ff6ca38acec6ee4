# The two set-up commands the README promises; each works on a fresh machine.
PYTHON ?= python3
PORT ?= 8000

.PHONY: serve test install install-test system-packages

# Install ferry and serve model_repo/ with the embedded broker.
serve: install
	ferry serve --model-repository model_repo --http-port $(PORT)

# Install everything (system packages, ferry, test tools) and run the whole suite.
test: system-packages install-test
	$(PYTHON) -m pytest

install:
	$(PYTHON) -m pip install --quiet -e .

install-test:
	$(PYTHON) -m pip install --quiet -e '.[test]'

# redis-server and kcat for the broker tests, java 17 and Maven for the Kafka broker the tests
# assemble from Maven Central, espeak-ng to speak the speech tests' sentences; skipped when
# already present.
system-packages:
	@if ! command -v redis-server >/dev/null || ! command -v kcat >/dev/null \
			|| ! command -v java >/dev/null || ! command -v mvn >/dev/null \
			|| ! command -v espeak-ng >/dev/null; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
			redis-server kcat openjdk-17-jre-headless maven espeak-ng; \
	fi
