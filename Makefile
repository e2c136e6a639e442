# The two commands of the README:
#   make main   set up .venv and run the main job (CoLoR vs baselines on offline digit streams)
#   make test   set up .venv and run the tests
PYTHON ?= python3
VENV := .venv
STAMP := $(VENV)/.installed

.PHONY: main test perf benchmarks setup clean

main: $(STAMP)
	$(VENV)/bin/python -m benchmarks.compare_digits

test: $(STAMP)
	$(VENV)/bin/python -m pytest tests

# The README's benchmark tables (benchmarks/results/<name>/); about an hour on 2 CPU cores.
benchmarks: $(STAMP)
	$(VENV)/bin/python -m benchmarks.compare --benchmark pacs --seeds 0 1 2 --epochs 3
	$(VENV)/bin/python -m benchmarks.compare --benchmark split_tiny_imagenet --seeds 0 1 2 --epochs 3 --train-per-class 200
	$(VENV)/bin/python -m benchmarks.compare --benchmark split_tiny_imagenet --methods CoLoR --k 1 5 10 20 \
		--epochs 3 --train-per-class 200 --name split_tiny_imagenet_k
	$(VENV)/bin/python -m benchmarks.compare --benchmark split_tiny_imagenet --methods CoLoR --rank 1 8 64 \
		--epochs 3 --train-per-class 200 --name split_tiny_imagenet_rank

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
