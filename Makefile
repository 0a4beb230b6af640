# autofuse: `make tune` and `make test` are all a fresh machine needs.
PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
SPACE  ?= ew_chain
TRIALS ?= 40
TIMEOUT ?= 8m
# The suite spends much of its time waiting on tuning subprocesses: two pytest workers fit
# the 15-minute CI budget on a 2-core machine (about 9 instead of 15 minutes).
TEST_WORKERS ?= 2

.PHONY: setup test tune soak bench leaderboard clean

$(STAMP): pyproject.toml
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "need $(PYTHON) (Python 3.11) on PATH"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test,peers]'
	touch $(STAMP)

setup: $(STAMP)

test: $(STAMP)
	$(BIN)/python -m pytest -q -m "not soak" -n $(TEST_WORKERS) --dist worksteal tests

# A real tuning job on the default search space into results/autofuse.db, then the leaderboard.
tune: $(STAMP)
	$(BIN)/autofuse tune $(SPACE) --target llvm --trials $(TRIALS) --timeout $(TIMEOUT)
	$(BIN)/autofuse leaderboard

leaderboard: $(STAMP)
	$(BIN)/autofuse leaderboard

soak: $(STAMP)
	$(BIN)/python -m pytest -q -m soak tests

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache .hypothesis
