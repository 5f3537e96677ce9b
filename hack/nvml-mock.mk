# The NVML mock: our own libnvidia-ml.so.1 (C, sources in hack/nvml-mock/).
# pynvml loads it by soname; tests and the demo point LD_LIBRARY_PATH (or
# PATCHBAY_NVML_LIBRARY, see driver/nvml/pynvml_library.py) at the build dir.
# Rebuilt only when a source or header changes; the binary is never committed.
NVML_MOCK_DIR := hack/nvml-mock
NVML_MOCK_BUILD := $(NVML_MOCK_DIR)/build
NVML_MOCK_LIB := $(NVML_MOCK_BUILD)/libnvidia-ml.so.1
NVML_MOCK_SRCS := $(wildcard $(NVML_MOCK_DIR)/*.c)
NVML_MOCK_HDRS := $(wildcard $(NVML_MOCK_DIR)/*.h)
NVML_MOCK_CC ?= cc
NVML_MOCK_CFLAGS := -std=c11 -D_GNU_SOURCE -O2 -g -fPIC -fvisibility=hidden \
	-Wall -Wextra -Werror -pthread
export NVML_MOCK_LIB

$(NVML_MOCK_LIB): $(NVML_MOCK_SRCS) $(NVML_MOCK_HDRS) hack/nvml-mock.mk
	@mkdir -p $(NVML_MOCK_BUILD)
	$(NVML_MOCK_CC) $(NVML_MOCK_CFLAGS) -shared -Wl,-soname,libnvidia-ml.so.1 \
		-o $@.tmp $(NVML_MOCK_SRCS)
	@mv $@.tmp $@

nvml-mock: $(NVML_MOCK_LIB) ## build the NVML mock library (hack/nvml-mock/build/libnvidia-ml.so.1)

.PHONY: nvml-mock
