# Quick start: `make demo` (train locally through real faults) and `make test` (the whole suite).
# Each target installs what it needs: a .venv with pinned versions and the cdk CLI from npm.

SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
IMAGE_VENV := .venv-image
IMAGE_PY := $(IMAGE_VENV)/bin/python
CDK_VERSION := 2.1148.1
CDK := .cache/cdk/node_modules/.bin/cdk
# The IaC scanner the tests run (tests/checkov.py); its version and its libraries' are pinned in
# constraints-checkov.txt.
CHECKOV := .cache/checkov/bin/checkov
# A real Prometheus server scrapes a training run in the tests (tests/trainer/telemetry).
PROMETHEUS := .cache/prometheus/bin/prometheus
PROFILE ?= p5
MODE ?=
OUTPUTS ?= cdk-outputs.json
# The image tag `make image` pushes; empty: the git commit, which the manifests use by default.
TAG ?=
export JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION := 20

.PHONY: demo test test-fast synth nag deploy destroy manifests image bench clean

$(VENV)/.installed: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -c constraints.txt -e '.[trainer,infra,dev]'
	touch $@

# The image leg: the GPU image's software on CPU ranks, on this machine's Python. Its torch (a
# CUDA build that sees no GPU) and transformers are pinned in requirements-image.txt with NVRx
# 0.7's dependencies; NVRx 0.7 itself (its wheel is for Python 3.12 only) is unpacked from the
# pinned wheel, checked by hash (devtools.image_nvrx). docs/testing.md says what it covers.
$(IMAGE_VENV)/.installed: pyproject.toml requirements-image.txt devtools/image_nvrx.py config/versions.py
	$(PYTHON) -m venv $(IMAGE_VENV)
	$(IMAGE_PY) -m pip install -q -r requirements-image.txt
	$(IMAGE_PY) -m pip install -q --no-deps -e .
	$(IMAGE_PY) -m devtools.image_nvrx
	touch $@

$(CDK):
	npm install --prefix .cache/cdk --no-audit --no-fund --silent aws-cdk@$(CDK_VERSION)

# A virtual environment of its own: checkov pins libraries at other versions than the project.
$(CHECKOV): constraints-checkov.txt
	$(PYTHON) -m venv .cache/checkov
	.cache/checkov/bin/pip install -q -c constraints-checkov.txt checkov
	touch $@

# Debian's package unpacked under .cache (no root needed, no service started: the test runs
# its own server on a loopback port); a prometheus already on PATH is used as it is.
$(PROMETHEUS):
	@mkdir -p $(dir $@)
	@if command -v prometheus >/dev/null; then ln -sf "$$(command -v prometheus)" $@; else \
		cd .cache/prometheus && rm -f prometheus_*.deb && \
		{ apt-get download -q prometheus 2>/dev/null || \
		  { [ "$$(id -u)" = 0 ] && apt-get update -q >/dev/null && apt-get download -q prometheus; }; } && \
		dpkg-deb -x prometheus_*.deb root && rm -f prometheus_*.deb && ln -sf ../root/usr/bin/prometheus bin/prometheus; \
	fi
	@$@ --version 2>&1 | head -1

demo: $(VENV)/.installed
	$(PY) -m devtools.demo

# Two legs at once. The main leg: the whole suite on this machine's pinned torch and NVRx 0.4.1.
# The image leg: the recovery tests (launch topology, spares, shrink, node loss, restarts) on the
# GPU image's torch and NVRx 0.7 ($(IMAGE_VENV)), its output shown after the main leg's. The main
# leg runs TEST_WORKERS pytest-xdist workers, the image leg IMAGE_WORKERS: many of a test job's
# seconds are waits (timeouts, hangs, restarts), and every job's timeouts follow the pace its
# worker measured under that load. The main leg's third worker fills the cores the image leg
# leaves once it ends (docs/testing.md).
# pytest exits 5 when it collects no tests: that is not a failure of the code under test.
# The set-up builds what the legs need side by side (downloads, mostly); its time and the tests'
# are printed apart, and the main leg's 15 slowest tests last.
# The image leg leaves out the `baseline` runs: they touch no NVRx but its checkpoint writer,
# which the other modes' runs exercise there; the main leg runs them.
TEST_WORKERS ?= 3
IMAGE_WORKERS ?= 2
IMAGE_TESTS ?= tests/trainer/recovery
IMAGE_SELECT ?= not baseline
SETUP := $(VENV)/.installed $(IMAGE_VENV)/.installed $(CDK) $(CHECKOV) $(PROMETHEUS)
test:
	@start=$$(date +%s); $(MAKE) --no-print-directory -j5 $(SETUP) || exit $$?; \
	echo "== set-up: $$(( $$(date +%s) - start )) s"; start=$$(date +%s); mkdir -p .cache; \
	$(IMAGE_PY) -m pytest -q -n $(IMAGE_WORKERS) --dist loadgroup -p no:cacheprovider \
		-k "$(IMAGE_SELECT)" $(IMAGE_TESTS) > .cache/image-leg.log 2>&1 & image=$$!; \
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadgroup --durations=15 | tee .cache/main-leg.log; \
	main=$${PIPESTATUS[0]}; wait $$image; leg=$$?; \
	echo "== image leg: torch $$($(IMAGE_PY) -c 'import torch; print(torch.__version__)'), NVRx 0.7, $(IMAGE_TESTS), $(IMAGE_SELECT)"; \
	cat .cache/image-leg.log; \
	echo "== tests: $$(( $$(date +%s) - start )) s, both legs"; \
	sed -n '/slowest 15 durations/,/^$$/p' .cache/main-leg.log; \
	for rc in $$main $$leg; do if [ $$rc -ne 0 ] && [ $$rc -ne 5 ]; then exit $$rc; fi; done

# The unit tier: the pure logic (settings, schedule, agreement, goodput, layouts, contract).
test-fast: $(VENV)/.installed $(CDK)
	$(PY) -m pytest -q -m "not slow"

synth: $(VENV)/.installed $(CDK)
	$(CDK) synth --quiet -c profile=$(PROFILE)

nag: $(VENV)/.installed $(CDK)
	$(CDK) synth --quiet -c profile=$(PROFILE) -c nag=true

deploy: $(VENV)/.installed $(CDK)
	$(CDK) deploy --all -c profile=$(PROFILE) --outputs-file $(OUTPUTS)

# Delete the training jobs first (`scripts/nvrx-eks cleanup`): pods that mount FSx block its deletion.
destroy: $(VENV)/.installed $(CDK)
	scripts/nvrx-eks cleanup --profile $(PROFILE) --outputs $(OUTPUTS)
	$(CDK) destroy --all --force -c profile=$(PROFILE)

manifests: $(VENV)/.installed
	$(PY) -m k8s synth --profile $(PROFILE) $(if $(MODE),--mode $(MODE)) --outputs $(OUTPUTS) --outdir dist/$(PROFILE)

# Needs Docker and AWS credentials; pushes an immutable tag (the git commit unless TAG is given),
# built with the profile's nvrx_version.
image: $(VENV)/.installed
	@image=$$(scripts/nvrx-eks image --profile $(PROFILE) --outputs $(OUTPUTS) $(if $(TAG),--image_tag $(TAG))) && \
	nvrx=$$(scripts/nvrx-eks image --profile $(PROFILE) --outputs $(OUTPUTS) --nvrx_version) && \
	registry=$${image%%/*} && region=$$(echo $$registry | cut -d. -f4) && \
	aws ecr get-login-password --region $$region | docker login --username AWS --password-stdin $$registry && \
	docker build --build-arg NVRX_VERSION=$$nvrx -t $$image . && docker push $$image

# GPU benchmarks (needs CUDA GPUs): floors, checkpoint cost and recovery in every mode, as JSON in
# bench/results/; `python -m bench.tables FILE.json` prints their rows for BENCHMARKS.md.
bench:
	$(PYTHON) -m bench.run all

clean:
	rm -rf $(VENV) $(IMAGE_VENV) .cache cdk.out dist runs
