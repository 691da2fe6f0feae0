# The two commands of the README: `make run` and `make test`. Everything they need is
# installed by them into .venv; the only system requirements are Python 3.11+ and Java 17.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.requirements-installed

.PHONY: run test lint setup browser clean

$(STAMP): requirements.txt
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Python 3.11+ is required; set PYTHON=/path/to/python3.11")'
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt
	@touch $(STAMP)

# A new Spark JVM starts in half the time with its classes archived (sparkjobs/class_archive.py);
# built once per JDK and Spark version, in about a minute.
setup: $(STAMP)
	@$(PY) -m sparkjobs.class_archive

run: setup
	$(PY) -m orchestrator.services.runconsole

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

# The browser tests drive Debian's chromium (never `playwright install`: machines may be
# offline or have no access to Playwright's download host).
CHROMIUM ?= /usr/bin/chromium
export BPCONSOLE_CHROMIUM := $(CHROMIUM)

browser:
	@if [ ! -x $(CHROMIUM) ]; then \
	  if [ "$$(id -u)" = "0" ]; then \
	    echo "Installing Debian's chromium for the browser tests..."; \
	    apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y chromium; \
	  else \
	    echo "The browser tests need Chromium at $(CHROMIUM): run 'sudo apt-get install -y chromium'"; \
	    echo "(or set CHROMIUM=/path/to/chromium), or skip them: $(PY) -m pytest -m 'not browser'"; \
	    exit 1; \
	  fi; \
	fi

# The suite runs in TEST_PROCESSES pytest-xdist processes, each with a stack of its own
# (services, Celery and Spark workers, files under var/test/gwN); 1 runs it in this one.
TEST_PROCESSES ?= 2

test: setup lint browser
	$(PY) -m pytest $(if $(filter 1,$(TEST_PROCESSES)),,-n $(TEST_PROCESSES))

clean:
	rm -rf var/test .pytest_cache .ruff_cache
