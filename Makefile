# The two commands of the README:
#   make main   set up .venv and run the main job (CoLoR vs baselines on offline digit streams, 5 seeds)
#   make test   set up .venv and run the tests
# The main job runs the installed command `avalanche-color compare` (the same as
# `python -m avalanche_color.runner compare`) and writes to runs/ (ignored by git); `make main-publish`
# rewrites the committed tables in benchmarks/results/ (--out-dir). Each comparison runs on one thread: the same numbers on every run on one kind
# of machine (torch's float sums depend on the thread count and the CPU; another CPU agrees within the
# spread over seeds: `python -m benchmarks.reporting.reproduce digits_class digits_domain` checks).
PYTHON ?= python3
VENV := .venv
STAMP := $(VENV)/.installed

.PHONY: main main-publish test perf benchmarks benchmarks-digits benchmarks-pacs benchmarks-tiny benchmarks-routing \
	benchmarks-routing-tiny benchmarks-routing-small benchmarks-routing-pacs benchmarks-routing-digits \
	benchmarks-lora-peers benchmarks-lora-peers-tiny benchmarks-lora-peers-small \
	benchmarks-tuned benchmarks-tuned-tiny benchmarks-tuned-small benchmarks-vit-ti \
	benchmarks-vit-ti-pacs benchmarks-vit-ti-tiny benchmarks-vit-ti-beyond benchmarks-vit-ti-beyond-pacs \
	benchmarks-vit-ti-beyond-tiny benchmarks-vit-ti-beyond-combined benchmarks-beyond-digits setup clean

MAIN := --methods CoLoR Naive EWC LwF Replay --epochs 5 --batch-size 32 --rank 16 --k 10 --loggers \
	--seeds 0 1 2 3 4 --baseline-seeds 0 1 2 3 4
main: $(STAMP)
	$(MAKE) --no-print-directory -j2 main-digits_class main-digits_domain
	@echo "Compare with the committed results, row by row:"
	@echo "  $(VENV)/bin/python -m benchmarks.reporting.reproduce digits_class digits_domain"

main-publish: $(STAMP)
	$(MAKE) --no-print-directory -j2 main-digits_class main-digits_domain PUBLISH="--out-dir benchmarks/results"

# The two streams side by side, each on one thread.
main-digits_%: $(STAMP)
	OMP_NUM_THREADS=1 $(VENV)/bin/avalanche-color compare --benchmark digits_$* $(MAIN) $(PUBLISH)

# Test workers: one per core (pytest-xdist); idle workers take the next test (worksteal), so the few tests
# that run 10-20 s (torchrun, the docs pages, the notebook) spread over the workers.
test: $(STAMP)
	$(VENV)/bin/python -m pytest -n auto --dist worksteal tests

# The README's benchmark tables (benchmarks/results/<name>/), each on one thread (the same numbers
# on every run): about 3.5 CPU hours; `make -j2 benchmarks` runs the lanes side by side (about
# 2 hours on 2 cores: the Tiny lane). The data: AVALANCHE_COLOR_DATA=<folder with the zips>.
# Interrupted? Run it again: --resume keeps every finished run.
BASELINE_METHODS := --methods CoLoR CoLoR++ CoLoR-oracle Naive EWC LwF Replay FT-masked NCM Joint-FT Joint-LoRA
PROMPT_METHODS := --methods S-Prompts L2P
COMPARE := OMP_NUM_THREADS=1 $(VENV)/bin/avalanche-color compare --out-dir benchmarks/results
PACS := --benchmark pacs --epochs 3
TINY := --benchmark split_tiny_imagenet --epochs 2 --train-per-class 100
DIGITS_BUDGET := --epochs 5 --batch-size 32 --rank 16 --k 10 --loggers
DIGITS := $(DIGITS_BUDGET) --methods CoLoR CoLoR++ --seeds 0 1 2
benchmarks: benchmarks-digits benchmarks-pacs benchmarks-tiny benchmarks-routing benchmarks-lora-peers

# Beyond the paper: class-level routers against CoLoR's prototypes and the training-free baselines,
# 3 seeds each (CoLoR, CoLoR++ and the oracle on PACS and Tiny: the baseline tables above). About
# 1 CPU hour; `make -j2 benchmarks-routing` runs the two lanes side by side.
ROUTERS := CoLoR-ridge CoLoR-gaussian CoLoR++-ridge NCM RanPAC
ROUTING := --seeds 0 1 2 --baseline-seeds 0 1 2 --resume
benchmarks-routing: benchmarks-routing-tiny benchmarks-routing-small

benchmarks-routing-tiny: $(STAMP)
	$(COMPARE) $(TINY) --methods $(ROUTERS) $(ROUTING) --name split_tiny_imagenet_routers

benchmarks-routing-small: benchmarks-routing-pacs benchmarks-routing-digits

benchmarks-routing-pacs: $(STAMP)
	$(COMPARE) $(PACS) --methods $(ROUTERS) $(ROUTING) --name pacs_routers

benchmarks-routing-digits: $(STAMP)
	$(COMPARE) --benchmark digits_class $(DIGITS_BUDGET) --methods CoLoR CoLoR++ CoLoR-oracle $(ROUTERS) $(ROUTING) --name digits_class_routers
	$(COMPARE) --benchmark digits_domain $(DIGITS_BUDGET) --methods CoLoR CoLoR++ $(ROUTERS) $(ROUTING) --name digits_domain_routers

benchmarks-digits: $(STAMP)
	$(COMPARE) --benchmark digits_class $(DIGITS) --name digits_class_prototypes_per_experience
	$(COMPARE) --benchmark digits_class $(DIGITS) --name digits_class_prototypes_per_class --prototypes-per-class 2
	$(COMPARE) --benchmark digits_domain $(DIGITS) --name digits_domain_prototypes_per_experience
	$(COMPARE) --benchmark digits_domain $(DIGITS) --name digits_domain_prototypes_per_class --prototypes-per-class 2

benchmarks-pacs: $(STAMP)
	$(COMPARE) $(PACS) $(BASELINE_METHODS) --seeds 0 1 2 --resume
	$(COMPARE) $(PACS) $(PROMPT_METHODS) --seeds 0 1 2 --name pacs_prompts --resume
	$(COMPARE) $(PACS) --methods CoLoR CoLoR++ --seeds 0 1 2 --prototypes-per-class 2 --name pacs_prototypes_per_class --resume

benchmarks-tiny: $(STAMP)
	$(COMPARE) $(TINY) $(BASELINE_METHODS) --seeds 0 1 2 --resume
	$(COMPARE) $(TINY) --methods CoLoR --k 1 5 10 20 --name split_tiny_imagenet_k --resume
	$(COMPARE) $(TINY) --methods CoLoR --rank 1 8 64 --name split_tiny_imagenet_rank --resume
	$(COMPARE) $(TINY) $(PROMPT_METHODS) --seeds 0 1 2 --name split_tiny_imagenet_prompts --resume
	$(COMPARE) $(TINY) --methods CoLoR CoLoR++ --seeds 0 1 2 --prototypes-per-class 2 --name split_tiny_imagenet_prototypes_per_class --resume

# The LoRA peers that route nothing (SD-LoRA, InfLoRA), 3 seeds on every offline benchmark at the
# budgets of the tables above, and the prompt peers on digits for the side-by-side table: about
# 1 CPU hour; `make -j2 benchmarks-lora-peers` runs the two lanes side by side.
LORA_PEERS := --methods SD-LoRA InfLoRA --seeds 0 1 2 --resume
benchmarks-lora-peers: benchmarks-lora-peers-tiny benchmarks-lora-peers-small

benchmarks-lora-peers-tiny: $(STAMP)
	$(COMPARE) $(TINY) $(LORA_PEERS) --name split_tiny_imagenet_lora_peers

benchmarks-lora-peers-small: $(STAMP)
	$(COMPARE) --benchmark digits_class $(DIGITS_BUDGET) $(LORA_PEERS) --name digits_class_lora_peers
	$(COMPARE) --benchmark digits_domain $(DIGITS_BUDGET) $(LORA_PEERS) --name digits_domain_lora_peers
	$(COMPARE) $(PACS) $(LORA_PEERS) --name pacs_lora_peers
	$(COMPARE) --benchmark digits_class $(DIGITS_BUDGET) $(PROMPT_METHODS) --seeds 0 1 2 --resume --name digits_class_prompts
	$(COMPARE) --benchmark digits_domain $(DIGITS_BUDGET) $(PROMPT_METHODS) --seeds 0 1 2 --resume --name digits_domain_prompts

# One tuning rule for every method (--tune lr): CoLoR, the prompt peers and the LoRA peers, each at the lr
# of one grid that scores best on a validation split of the training experiences (seed 0), then 3 seeds;
# the two CVPR 2025 methods (LoRA subtraction, CL-LoRA) under the same rule in folders of their own.
# About 7 CPU hours; `make -j2 benchmarks-tuned` runs the two lanes side by side.
TUNED := --methods CoLoR S-Prompts L2P SD-LoRA InfLoRA --tune lr --seeds 0 1 2 --resume
TUNED_2025 := --methods LoRA-Sub CL-LoRA --tune lr --seeds 0 1 2 --resume
benchmarks-tuned: benchmarks-tuned-tiny benchmarks-tuned-small

benchmarks-tuned-tiny: $(STAMP)
	$(COMPARE) $(TINY) $(TUNED) --name split_tiny_imagenet_tuned
	$(COMPARE) $(TINY) $(TUNED_2025) --name split_tiny_imagenet_tuned_2025

benchmarks-tuned-small: $(STAMP)
	$(COMPARE) --benchmark digits_class $(DIGITS_BUDGET) $(TUNED) --name digits_class_tuned
	$(COMPARE) --benchmark digits_domain $(DIGITS_BUDGET) $(TUNED) --name digits_domain_tuned
	$(COMPARE) $(PACS) $(TUNED) --name pacs_tuned
	$(COMPARE) --benchmark digits_class $(DIGITS_BUDGET) $(TUNED_2025) --name digits_class_tuned_2025
	$(COMPARE) --benchmark digits_domain $(DIGITS_BUDGET) $(TUNED_2025) --name digits_domain_tuned_2025
	$(COMPARE) $(PACS) $(TUNED_2025) --name pacs_tuned_2025

# Every method on an ImageNet-pretrained ViT-Ti/16 (docs/benchmarks: "On an ImageNet-pretrained ViT-Ti/16"), one
# lane per benchmark, each on one thread: about 8 CPU hours a lane. The weights file is found in
# AVALANCHE_COLOR_MODELS, the data in AVALANCHE_COLOR_DATA. SD-LoRA, InfLoRA and L2P run in folders of their own,
# after their diagnosis on this backbone (benchmarks/investigations/starved_methods.py). Then each table's grid
# edges: for every method tuned at an end of --lr-grid, the trials beyond it (benchmarks/investigations/grid_edges.py).
# Interrupted? Run it again.
GRID_EDGES := OMP_NUM_THREADS=1 $(VENV)/bin/python -m benchmarks.investigations.grid_edges --recheck
VIT_TI := --backbone vit_tiny_patch16_224-imagenet.safetensors --architecture vit_tiny_patch16_224 --image-size 112 \
	--epochs 2 --batch-size 32 --loggers --tune lr --seeds 0 1 2 --baseline-seeds 0 1 2 --resume
VIT_TI_METHODS := --methods CoLoR CoLoR++ CoLoR-oracle CoLoR-ridge CoLoR-gaussian CoLoR++-ridge S-Prompts LoRA-Sub \
	CL-LoRA RanPAC NCM Joint-LoRA FT-masked Naive EWC LwF Replay
VIT_TI_PEERS := --methods SD-LoRA InfLoRA L2P
benchmarks-vit-ti: benchmarks-vit-ti-pacs benchmarks-vit-ti-tiny

benchmarks-vit-ti-pacs: $(STAMP)
	$(COMPARE) --benchmark pacs --train-per-class 100 $(VIT_TI) $(VIT_TI_METHODS) --name pacs_vit_ti
	$(COMPARE) --benchmark pacs --train-per-class 100 $(VIT_TI) $(VIT_TI_PEERS) --name pacs_vit_ti_peers
	$(GRID_EDGES) benchmarks/results/pacs_vit_ti benchmarks/results/pacs_vit_ti_peers

benchmarks-vit-ti-tiny: $(STAMP)
	$(COMPARE) --benchmark split_tiny_imagenet --train-per-class 50 $(VIT_TI) $(VIT_TI_METHODS) \
		--name split_tiny_imagenet_vit_ti
	$(COMPARE) --benchmark split_tiny_imagenet --train-per-class 50 $(VIT_TI) $(VIT_TI_PEERS) \
		--name split_tiny_imagenet_vit_ti_peers
	$(GRID_EDGES) benchmarks/results/split_tiny_imagenet_vit_ti benchmarks/results/split_tiny_imagenet_vit_ti_peers

# CoLoR's options beyond the paper (docs/beyond-the-paper.md) on the ViT-Ti tables' budget, beside their rows: top-2
# routing and HRM-PET's re-matching train exactly as CoLoR (its tuned lr carried from the table's folder, --lr-from),
# the warm start trains otherwise (tuned by the tables' rule, --tune lr). One lane per benchmark.
VIT_TI_CARRIED := $(filter-out --tune lr,$(VIT_TI))
BEYOND_ROUTING := --methods CoLoR-top2 CoLoR-rematch
benchmarks-vit-ti-beyond: benchmarks-vit-ti-beyond-pacs benchmarks-vit-ti-beyond-tiny

benchmarks-vit-ti-beyond-pacs: $(STAMP)
	$(COMPARE) --benchmark pacs --train-per-class 100 $(VIT_TI_CARRIED) $(BEYOND_ROUTING) \
		--lr-from benchmarks/results/pacs_vit_ti --name pacs_vit_ti_beyond_routing
	$(COMPARE) --benchmark pacs --train-per-class 100 $(VIT_TI) --methods CoLoR-warm --name pacs_vit_ti_beyond_warm

benchmarks-vit-ti-beyond-tiny: $(STAMP)
	$(COMPARE) --benchmark split_tiny_imagenet --train-per-class 50 $(VIT_TI_CARRIED) $(BEYOND_ROUTING) \
		--lr-from benchmarks/results/split_tiny_imagenet_vit_ti --name split_tiny_imagenet_vit_ti_beyond_routing
	$(COMPARE) --benchmark split_tiny_imagenet --train-per-class 50 $(VIT_TI) --methods CoLoR-warm \
		--name split_tiny_imagenet_vit_ti_beyond_warm

# The two options that helped, together: the warm start's experts routed by the Gaussian router. It trains exactly
# as CoLoR-warm, whose tuned lr it takes from that table's folder. After the lanes above.
BEYOND_COMBINED := --methods CoLoR-gaussian-warm
benchmarks-vit-ti-beyond-combined: $(STAMP)
	$(COMPARE) --benchmark pacs --train-per-class 100 $(VIT_TI_CARRIED) $(BEYOND_COMBINED) \
		--lr-from benchmarks/results/pacs_vit_ti_beyond_warm --name pacs_vit_ti_beyond_combined
	$(COMPARE) --benchmark split_tiny_imagenet --train-per-class 50 $(VIT_TI_CARRIED) $(BEYOND_COMBINED) \
		--lr-from benchmarks/results/split_tiny_imagenet_vit_ti_beyond_warm --name split_tiny_imagenet_vit_ti_beyond_combined

# The same options on the digits streams at their tables' budget (untuned, as the other digits tables), beside the
# paper's CoLoR and the Gaussian router, then those that learn otherwise than CoLoR tuned as the digits tuned tables
# (beside their CoLoR): seconds a run.
BEYOND_DIGITS := --methods CoLoR CoLoR-warm CoLoR-top2 CoLoR-rematch CoLoR-gaussian CoLoR-gaussian-warm --seeds 0 1 2 --resume
BEYOND_DIGITS_TUNED := --methods CoLoR-warm CoLoR-gaussian CoLoR-gaussian-warm --tune lr --seeds 0 1 2 --resume
benchmarks-beyond-digits: $(STAMP)
	$(COMPARE) --benchmark digits_class $(DIGITS_BUDGET) $(BEYOND_DIGITS) --name digits_class_beyond
	$(COMPARE) --benchmark digits_domain $(DIGITS_BUDGET) $(BEYOND_DIGITS) --name digits_domain_beyond
	$(COMPARE) --benchmark digits_domain $(DIGITS_BUDGET) $(BEYOND_DIGITS_TUNED) --name digits_domain_beyond_tuned
	$(COMPARE) --benchmark digits_class $(DIGITS_BUDGET) $(BEYOND_DIGITS_TUNED) --name digits_class_beyond_tuned

# The paper's headline at the paper's budget (docs/benchmarks/budget.md): the paper's protocol (--preset paper: SGD
# with cosine per experience, weight decay 2e-4, batch 128, rank 64, k 5 or 20, RandomResizedCrop and flip) on the
# ImageNet ViT-Ti at 112 px, every training image of PACS, 100 per class of Split Tiny-ImageNet, from 2 to 50 epochs
# per experience. One tuning rule: each method's lr chosen at 5 epochs (--tune lr over BUDGET_GRID, on the validation
# split), carried to every other budget (--lr-from; a CoLoR variant takes CoLoR's). Each point is one folder per lane
# under benchmarks/results/<benchmark>_budget/; `python -m benchmarks.reporting.budget_curves` tables and plots them.
# Lanes, one per core, each resumable (--resume, and a checkpoint after every epoch): about 30 CPU hours in all,
# in the order the lanes list them. Run them from a worktree at a commit of main (results.json names it).
# The tuning rule: each method's grid is three learning rates a factor of about 3 apart around its choice on the
# same benchmark's ViT-Ti table (five values, 1e-3 to 0.1, at 2 epochs): 0.01 for CoLoR, S-Prompts, SD-LoRA and
# Joint-LoRA, 0.1 for CL-LoRA, 0.001 for Naive and Replay, LoRA subtraction's 0.003 on PACS and 0.001 on Split
# Tiny-ImageNet; tuned once at 5 epochs, carried to every other budget (--lr-from).
BUDGET_GRID := --lr-grid 0.003 0.01 0.03
CL_LORA_GRID := --lr-grid 0.03 0.1 0.3
FINE_TUNING_GRID := --lr-grid 0.0003 0.001 0.003
BUDGET_VIT_TI := --preset paper --backbone vit_tiny_patch16_224-imagenet.safetensors --architecture vit_tiny_patch16_224 \
	--image-size 112 --loggers --seeds 0 --baseline-seeds 0 --resume --checkpoint-epochs 1
BUDGET_PACS := OMP_NUM_THREADS=1 $(VENV)/bin/python -m avalanche_color.runner compare --benchmark pacs $(BUDGET_VIT_TI) \
	--out-dir benchmarks/results/pacs_budget
BUDGET_TINY := OMP_NUM_THREADS=1 $(VENV)/bin/python -m avalanche_color.runner compare --benchmark split_tiny_imagenet \
	--train-per-class 100 $(BUDGET_VIT_TI) --out-dir benchmarks/results/split_tiny_imagenet_budget
PACS_TUNED := benchmarks/results/pacs_budget/e05_
TINY_TUNED := benchmarks/results/split_tiny_imagenet_budget/e05_
BUDGET_PEERS := CL-LoRA LoRA-Sub SD-LoRA Joint-LoRA
BUDGET_BASELINES := Naive Replay NCM RanPAC
.PHONY: budget-pacs-color budget-pacs-s-prompts budget-pacs-seeds budget-pacs-peers budget-pacs-baselines budget-tiny-color \
	budget-tiny-s-prompts budget-tiny-peers budget-tiny-baselines

# Lane 1: CoLoR at rank 64 (the paper's) and 8 (the ViT-Ti tables'), then its routers' variants at 20 epochs: one
# CoLoR training, each variant evaluated on its experts (the runner's "variants on one training"), whose CoLoR run
# repeats e20_color's rank-64 one at a later commit.
budget-pacs-color: $(STAMP)
	$(BUDGET_PACS) --methods CoLoR --rank 64 8 --epochs 5 --tune lr $(BUDGET_GRID) --name e05_color
	$(BUDGET_PACS) --methods CoLoR --rank 64 8 --epochs 2 --lr-from $(PACS_TUNED)color --name e02_color
	$(BUDGET_PACS) --methods CoLoR --rank 64 8 --epochs 20 --lr-from $(PACS_TUNED)color --name e20_color
	$(BUDGET_PACS) --methods CoLoR --rank 64 --epochs 10 --lr-from $(PACS_TUNED)color --name e10_color
	$(BUDGET_PACS) --methods CoLoR --rank 64 --epochs 50 --lr-from $(PACS_TUNED)color --name e50_color
	$(BUDGET_PACS) --methods CoLoR CoLoR-oracle CoLoR-gaussian CoLoR-top2 CoLoR-rematch --rank 64 --epochs 20 \
		--lr-from $(PACS_TUNED)color --name e20_color_routers

# Lane 2: S-Prompts, the paper's rival, at every budget.
budget-pacs-s-prompts: $(STAMP)
	$(BUDGET_PACS) --methods S-Prompts --epochs 5 --tune lr $(BUDGET_GRID) --name e05_s_prompts
	$(BUDGET_PACS) --methods S-Prompts --epochs 2 --lr-from $(PACS_TUNED)s_prompts --name e02_s_prompts
	$(BUDGET_PACS) --methods S-Prompts --epochs 20 --lr-from $(PACS_TUNED)s_prompts --name e20_s_prompts
	$(BUDGET_PACS) --methods S-Prompts --epochs 10 --lr-from $(PACS_TUNED)s_prompts --name e10_s_prompts
	$(BUDGET_PACS) --methods S-Prompts --epochs 50 --lr-from $(PACS_TUNED)s_prompts --name e50_s_prompts

# The rule's 3 seeds where CoLoR and its nearest rival lie within 2 points (PACS at 2 epochs: CoLoR 71.4, S-Prompts
# 72.3), in the same folders (--resume reads seed 0 back): run it at the commit those folders name.
budget-pacs-seeds: $(STAMP)
	$(BUDGET_PACS) --methods CoLoR --rank 64 8 --epochs 2 --lr-from $(PACS_TUNED)color --seeds 0 1 2 --name e02_color
	$(BUDGET_PACS) --methods S-Prompts --epochs 2 --lr-from $(PACS_TUNED)s_prompts --seeds 0 1 2 --name e02_s_prompts

# Lanes 3 and 4: the LoRA peers and the shared-model and training-free baselines, tuned at 5 epochs (one
# comparison per grid), then at 20.
budget-pacs-peers: $(STAMP)
	$(BUDGET_PACS) --methods SD-LoRA Joint-LoRA --rank 64 --epochs 5 --tune lr $(BUDGET_GRID) --name e05_peers
	$(BUDGET_PACS) --methods CL-LoRA --rank 64 --epochs 5 --tune lr $(CL_LORA_GRID) --name e05_cl_lora
	$(BUDGET_PACS) --methods LoRA-Sub --rank 64 --epochs 5 --tune lr --lr-grid 0.001 0.003 0.01 --name e05_lora_sub
	$(BUDGET_PACS) --methods $(BUDGET_PEERS) --rank 64 --epochs 20 \
		--lr-from $(PACS_TUNED)peers $(PACS_TUNED)cl_lora $(PACS_TUNED)lora_sub --name e20_peers

budget-pacs-baselines: $(STAMP)
	$(BUDGET_PACS) --methods $(BUDGET_BASELINES) --epochs 5 --tune lr $(FINE_TUNING_GRID) --name e05_baselines
	$(BUDGET_PACS) --methods Naive Replay --epochs 20 --lr-from $(PACS_TUNED)baselines --name e20_baselines

# Split Tiny-ImageNet: CoLoR and S-Prompts at 2, 5 and 10 epochs, the others at 5 and 10.
budget-tiny-color: $(STAMP)
	$(BUDGET_TINY) --methods CoLoR --rank 64 8 --epochs 5 --tune lr $(BUDGET_GRID) --name e05_color
	$(BUDGET_TINY) --methods CoLoR CoLoR-oracle CoLoR-gaussian CoLoR-top2 CoLoR-rematch --rank 64 --epochs 10 \
		--lr-from $(TINY_TUNED)color --name e10_color
	$(BUDGET_TINY) --methods CoLoR --rank 64 --epochs 2 --lr-from $(TINY_TUNED)color --name e02_color

budget-tiny-s-prompts: $(STAMP)
	$(BUDGET_TINY) --methods S-Prompts --epochs 5 --tune lr $(BUDGET_GRID) --name e05_s_prompts
	$(BUDGET_TINY) --methods S-Prompts --epochs 10 --lr-from $(TINY_TUNED)s_prompts --name e10_s_prompts
	$(BUDGET_TINY) --methods S-Prompts --epochs 2 --lr-from $(TINY_TUNED)s_prompts --name e02_s_prompts

budget-tiny-peers: $(STAMP)
	$(BUDGET_TINY) --methods SD-LoRA Joint-LoRA --rank 64 --epochs 5 --tune lr $(BUDGET_GRID) --name e05_peers
	$(BUDGET_TINY) --methods CL-LoRA --rank 64 --epochs 5 --tune lr $(CL_LORA_GRID) --name e05_cl_lora
	$(BUDGET_TINY) --methods LoRA-Sub --rank 64 --epochs 5 --tune lr $(FINE_TUNING_GRID) --name e05_lora_sub
	$(BUDGET_TINY) --methods $(BUDGET_PEERS) --rank 64 --epochs 10 \
		--lr-from $(TINY_TUNED)peers $(TINY_TUNED)cl_lora $(TINY_TUNED)lora_sub --name e10_peers

budget-tiny-baselines: $(STAMP)
	$(BUDGET_TINY) --methods $(BUDGET_BASELINES) --epochs 5 --tune lr $(FINE_TUNING_GRID) --name e05_baselines
	$(BUDGET_TINY) --methods Naive Replay --epochs 10 --lr-from $(TINY_TUNED)baselines --name e10_baselines

# Speed and memory ratios (benchmarks/results/perf.md); peft only as a point of comparison.
perf: $(STAMP)
	$(VENV)/bin/python -m pip install -c constraints.txt -e '.[test,benchmarks,perf]'
	$(VENV)/bin/python -m benchmarks.perf

setup: $(STAMP)

# A CPU-only machine (Linux): PyPI's Linux torch is the CUDA build (about 5 GB with its nvidia-* wheels). This takes
# the CPU build of the same pinned pair from PyTorch's CPU index first; constraints.txt's torch==2.14.1 admits
# 2.14.1+cpu, so the next step keeps it (docs/installing.md).
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
setup-cpu:
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install --index-url $(TORCH_CPU_INDEX) $$(grep -E '^torch(vision)?==' constraints.txt)
	$(MAKE) --no-print-directory setup

# Offline install (docs/installing.md): `make wheelhouse` (online, with the node's Python version) writes the package
# and every dependency but torch, torchvision and torch's CUDA wheels to wheelhouse/ (about 200 MB); on the node,
# `make install-offline PYTHON=<its environment's python>` installs from it alone, keeping that torch.
wheelhouse:
	$(PYTHON) -m benchmarks.wheelhouse build --out wheelhouse

install-offline:
	$(PYTHON) -m benchmarks.wheelhouse install --wheelhouse wheelhouse --python $(PYTHON)

# Reinstalls whenever the dependency pins change.
$(STAMP): setup.cfg pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install --upgrade pip
	$(VENV)/bin/python -m pip install -c constraints.txt -e '.[test,benchmarks]'
	touch $(STAMP)

clean:
	rm -rf $(VENV) *.egg-info
