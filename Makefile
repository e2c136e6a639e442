# The two commands of the README:
#   make main   set up .venv and run the main job (CoLoR vs baselines on offline digit streams)
#   make test   set up .venv and run the tests
PYTHON ?= python3
VENV := .venv
STAMP := $(VENV)/.installed

.PHONY: main test perf setup clean

main: $(STAMP)
	$(VENV)/bin/python -m benchmarks.compare_digits

test: $(STAMP)
	$(VENV)/bin/python -m pytest tests

# Speed and memory ratios (benchmarks/results/perf.md); peft only as a point of comparison.
perf: $(STAMP)
	$(VENV)/bin/python -m pip install -c constraints.txt -e '.[test,benchmarks,perf]'
	$(VENV)/bin/python -m benchmarks.perf

setup: $(STAMP)

# Reinstalls whenever the dependency pins change.
$(STAMP): setup.cfg pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install --upgrade pip
	$(VENV)/bin/python -m pip install -c constraints.txt -e '.[test,benchmarks]'
	touch $(STAMP)

clean:
	rm -rf $(VENV) *.egg-info
