#!/usr/bin/env python3
"""scripts/readme_blocks.py on small Markdown files: a block that fails is reported by its line and
command, blocks share variables, rules skip and shorten, a background job that fails fails its
block, a stale replace rule is refused, and the README's own rules all parse (--list).

Usage: readme_blocks_test.py [repository root]
"""
import os
import pathlib
import subprocess
import sys
import tempfile
import unittest

ROOT = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).resolve().parents[2])
SCRIPT = ROOT / "scripts" / "readme_blocks.py"


class ReadmeBlocks(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = pathlib.Path(self.tmp.name)
        # A stand-in build tree: the script only needs build/default/tools/fedlora to exist.
        (self.dir / "build" / "tools").mkdir(parents=True)
        fedlora = self.dir / "build" / "tools" / "fedlora"
        fedlora.write_text("#!/bin/sh\necho fedlora \"$@\"\n")
        fedlora.chmod(0o755)

    def tearDown(self):
        self.tmp.cleanup()

    def check(self, markdown, *args):
        md = self.dir / "doc.md"
        md.write_text(markdown)
        return subprocess.run([sys.executable, str(SCRIPT), str(md), "--build-dir", str(self.dir / "build"),
                               "--timeout", "20", *args], capture_output=True, text=True, timeout=120)

    def test_a_failing_command_is_named_by_its_line(self):
        r = self.check("# t\n\n```sh\nX=1\necho ok\nfalse --flag   # line 6\necho never\n```\n")
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertIn("FAIL doc.md:4 failed (exit 1)", r.stdout)
        self.assertIn("doc.md:6: exit 1: false --flag", r.stdout)
        self.assertNotIn("never", r.stdout)

    def test_blocks_share_variables_and_run_in_the_scratch_copy(self):
        r = self.check("```sh\nB=build/default/tools/fedlora\n```\n\ntext\n\n"
                       "```bash\n$B train --x 1 | grep -q 'fedlora train --x 1'\n"
                       "test -f scripts/readme_blocks.py && test ! -e .git\n```\n")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("2 of 2 blocks passed", r.stdout)

    def test_rules_skip_shorten_and_mark_slow(self):
        md = ("<!-- readme-check: skip (needs podman) -->\n```sh\nfalse\n```\n"
              "<!-- readme-check: replace 'sleep 600' 'true' -->\n```sh\nsleep 600\n```\n"
              "<!-- readme-check: slow (long) -->\n```sh\nfalse\n```\n"
              "```python\nnot shell\n```\n")
        r = self.check(md, "--quick")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("skip doc.md:3 (needs podman)", r.stdout)
        self.assertIn("'sleep 600' -> 'true'", r.stdout)
        self.assertIn("1 of 1 blocks passed, 2 skipped", r.stdout)
        # Without --quick the slow block runs (and fails here).
        self.assertEqual(self.check(md).returncode, 1)

    def test_a_failing_background_job_fails_its_block(self):
        r = self.check("```sh\n(sleep 1; exit 3) &\necho started\n```\n")
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertIn("background job exited 3", r.stdout)

    def test_a_block_past_its_timeout_is_killed(self):
        r = self.check("<!-- readme-check: timeout 2 -->\n```sh\nsleep 60 &\nsleep 60\n```\n")
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertIn("timed out after 2 s", r.stdout)

    def test_a_failing_before_rule_is_said(self):
        r = self.check("<!-- readme-check: before test -f missing -->\n```sh\ntrue\n```\n")
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertIn("doc.md:3: a before rule failed, exit 1: test -f missing", r.stdout)

    def test_a_stale_replace_rule_is_refused(self):
        r = self.check("<!-- readme-check: replace 'gone' 'x' -->\n```sh\ntrue\n```\n")
        self.assertEqual(r.returncode, 2)
        self.assertIn("'gone' does not occur in the block", r.stderr)

    def test_make_build_is_left_out_and_said(self):
        r = self.check("```sh\ntrue && make build\nmake build   # builds\nmake build && echo after\n```\n")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("line 2: 'make build' left out", r.stdout)
        self.assertIn("line 4: 'make build' left out", r.stdout)

    def test_the_readmes_rules_parse(self):
        r = subprocess.run([sys.executable, str(SCRIPT), "--list"], capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("SKIP", r.stdout)


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1])
