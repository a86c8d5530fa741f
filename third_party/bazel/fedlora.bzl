"""fedlora_cc_test: cmake/FedloraHelpers.cmake's fedlora_cc_test for Bazel.

  fedlora_cc_test(name = "status_test", srcs = ["status_test.cc"], deps = ["//core"])

links GoogleTest, GoogleMock and gtest_main (from the system, like CMake). `labels` are CMake's
LABELS: "unit" is the default, the others ("integration", "slow", "gpu") become tags, so that
`--test_tag_filters=-integration,-slow` keeps the unit tests. `timeout_s` is CMake's TIMEOUT
(default 300), rounded up to Bazel's classes. `source_tree = True` gives the test
FEDLORA_SOURCE_DIR (as CTest does): the runfiles root, where `data` files keep their repository
paths; `binary_dir = True` likewise gives FEDLORA_BINARY_DIR, under which `//tools:fedlora` is
tools/fedlora as in a CMake build folder.
"""

def _timeout(seconds):
    if seconds <= 60:
        return "short"
    if seconds <= 300:
        return "moderate"
    if seconds <= 900:
        return "long"
    return "eternal"

def fedlora_cc_test(
        name,
        srcs,
        deps = [],
        labels = ["unit"],
        timeout_s = 300,
        source_tree = False,
        binary_dir = False,
        data = [],
        defines = [],
        tags = []):
    env = {}
    if source_tree:
        env["FEDLORA_SOURCE_DIR"] = "."
    if binary_dir:
        env["FEDLORA_BINARY_DIR"] = "."
    native.cc_test(
        name = name,
        srcs = srcs,
        deps = deps + ["@system_libs//:gtest"],
        data = data,
        local_defines = defines,
        env = env,
        size = "medium",
        timeout = _timeout(timeout_s),
        tags = [l for l in labels if l != "unit"] + tags,
    )
