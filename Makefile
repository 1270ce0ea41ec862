# Quick start: `make demo` (train locally through real faults) and `make test` (the whole suite).
# Each target installs what it needs: a .venv with pinned versions and the cdk CLI from npm.

SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
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

# pytest exits 5 when it collects no tests: that is not a failure of the code under test.
# Two workers (pytest-xdist): most of a test job's seconds are waits (timeouts, hangs,
# restarts), and every job's timeouts follow the pace its worker measured under that load.
TEST_WORKERS ?= 2
test: $(VENV)/.installed $(CDK) $(CHECKOV) $(PROMETHEUS)
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadgroup; rc=$$?; if [ $$rc -eq 5 ]; then echo "no tests collected"; rc=0; fi; exit $$rc

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
	@image=$$(scripts/nvrx-eks image --profile $(PROFILE) --outputs $(OUTPUTS) $(if $(TAG),--image-tag $(TAG))) && \
	nvrx=$$(scripts/nvrx-eks image --profile $(PROFILE) --outputs $(OUTPUTS) --nvrx-version) && \
	registry=$${image%%/*} && region=$$(echo $$registry | cut -d. -f4) && \
	aws ecr get-login-password --region $$region | docker login --username AWS --password-stdin $$registry && \
	docker build --build-arg NVRX_VERSION=$$nvrx -t $$image . && docker push $$image

# GPU benchmarks (needs CUDA GPUs): floors, checkpoint cost and recovery in every mode, as JSON in
# bench/results/; `python -m bench.tables FILE.json` prints their rows for BENCHMARKS.md.
bench:
	$(PYTHON) -m bench.run all

clean:
	rm -rf $(VENV) .cache cdk.out dist runs
