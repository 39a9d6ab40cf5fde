from __future__ import annotations

import os
import sys
from dataclasses import replace

import pytest

from patcher import releases
from patcher.proof.detect import adaptive_supported, adaptive_v1_only, dynspec_applied, gc_warning_supported, locate
from patcher.proof.errors import ProofUsageError
from patcher.proof.run import refusal_cases
from tests.conftest import RELEASES


def test_the_package_is_found_from_a_site_dir_a_package_dir_or_a_checkout(site, tmp_path):
    root = site()
    pkg = root / "sglang"
    checkout = tmp_path / "checkout"
    (checkout / "python").mkdir(parents=True)
    os.symlink(pkg, checkout / "python" / "sglang")
    found = {spec: locate(str(spec), sys.executable, dict(os.environ)) for spec in (root, pkg, checkout)}
    assert [(f.package, f.pythonpath) for f in found.values()] == [
        (pkg, str(root)),
        (pkg, str(root)),
        (checkout / "python" / "sglang", str(checkout / "python")),
    ]


def test_auto_finds_what_the_server_python_imports(site):
    root = site(version="0.5.17", workers=("v2",))
    found = locate("auto", sys.executable, {**os.environ, "PYTHONPATH": str(root)})
    assert found.package == root / "sglang"
    assert found.version == "0.5.17"
    assert found.dynspec_applied and found.pythonpath is None
    assert found.has_worker("v2") and not found.has_worker("v1")


def test_auto_without_sglang_is_a_usage_error():
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    with pytest.raises(ProofUsageError, match="cannot find an SGLang"):
        locate("auto", sys.executable, env)


def test_a_path_goes_first_on_the_servers_pythonpath(site):
    other, mine = site(), site(applied=False)
    found = locate(str(mine), sys.executable, {**os.environ, "PYTHONPATH": str(other)})
    assert found.package == mine / "sglang"
    assert found.pythonpath == str(mine)
    assert not found.dynspec_applied


def test_a_path_that_is_not_sglang_is_a_usage_error(tmp_path):
    with pytest.raises(ProofUsageError, match="no sglang/srt/server_args.py"):
        locate(str(tmp_path), sys.executable, dict(os.environ))


def test_version_comes_from_version_files_or_dist_info(site, tmp_path):
    pkg = site(version="0.5.12") / "sglang"

    def version() -> str:
        return locate(str(pkg), sys.executable, dict(os.environ)).version

    assert version() == "0.5.12"
    (pkg / "_version.py").unlink()
    assert version() == "unknown"
    meta = pkg.parent / "sglang-0.5.13.dist-info"
    meta.mkdir()
    (meta / "METADATA").write_text("Metadata-Version: 2.1\nName: sglang\nVersion: 0.5.13\n")
    assert version() == "0.5.13"


def test_dynspec_is_seen_in_the_split_server_args_of_0_5_20(site):
    pkg = site(applied=False) / "sglang"
    assert not dynspec_applied(pkg)
    spec = pkg / "srt" / "arg_groups" / "fields"
    spec.mkdir(parents=True)
    (spec / "spec.py").write_text("class Spec:\n    speculative_disable_batch_size: A[Optional[int], 'x'] = None\n")
    assert dynspec_applied(pkg)


def test_adaptive_support_is_the_field_not_a_mention(site):
    pkg = site(adaptive=True) / "sglang"
    assert adaptive_supported(pkg)
    old = site() / "sglang"  # a patched 0.5.12: dynspec's own check names the flag
    with (old / "srt" / "server_args.py").open("a") as f:
        f.write('    x = getattr(args, "speculative_adaptive", False)  # speculative_adaptive_config\n')
    assert not adaptive_supported(old)
    spec = old / "srt" / "arg_groups" / "fields"
    spec.mkdir(parents=True)
    (spec / "spec.py").write_text("class Spec:\n    speculative_adaptive_config: A[Optional[str], 'x'] = None\n")
    assert adaptive_supported(old)
    assert locate(str(old), sys.executable, dict(os.environ)).adaptive_supported


def test_the_revisions_in_the_tree_are_read_from_the_engines_own_markers(tmp_path):
    """Every patch's ``marker()``, as the engine writes it, reads back as its id and revision;
    a file's highest revision wins, and a comment that only mentions dynspec is not a marker."""
    from patcher.proof.detect import applied_revisions
    from patcher.registry import all_patches

    patches = all_patches()
    srt = tmp_path / "sglang" / "srt"
    (srt / "speculative").mkdir(parents=True)
    for n, patch in enumerate(patches.values()):
        (srt / "speculative" / f"f{n}.py").write_text(f"x = 1\n    {patch.marker()}\ny = 2\n")
    (srt / "old.py").write_text("# dynspec: speculative_dynspec_v2 r1\n")
    (srt / "mentions.py").write_text("z = 3  # dynspec: speculative_dynspec_runtime r99 is not a marker\n")
    found = applied_revisions(tmp_path / "sglang")
    assert found == {patch_id: patch.REVISION for patch_id, patch in patches.items()}
    assert applied_revisions(tmp_path / "missing") == {}  # control: nothing there, nothing read


ADAPTIVE_MEMBERS = ["srt/speculative/adaptive_spec_params.py", "srt/server_args.py"]
V1_ONLY_IF = "    if not server_args.disable_overlap_schedule:\n"


@pytest.mark.parametrize("version", RELEASES)
def test_only_0_5_11_turns_upstream_adaptive_off_under_the_overlap_scheduler(version):
    """A release fact (session 31: 0.5.11's v2 server served ``--speculative-adaptive`` with it off,
    so dynspec's check had nothing to refuse); every other release with the flag keeps it on v2."""
    package = releases.unpacked(version, ADAPTIVE_MEMBERS) / "sglang"
    assert adaptive_v1_only(package) == (version == "0.5.11")
    assert not adaptive_v1_only(package) or adaptive_supported(package)


def test_adaptive_v1_only_reads_the_reason_not_a_mention(tmp_path):
    """Negative controls: 0.5.11's source with the overlap condition changed, and 0.5.12's with it added."""
    member = ADAPTIVE_MEMBERS[0]
    old = (releases.unpacked("0.5.11", ADAPTIVE_MEMBERS) / "sglang" / member).read_text()
    new = (releases.unpacked("0.5.12", ADAPTIVE_MEMBERS) / "sglang" / member).read_text()
    assert old.count(V1_ONLY_IF) == 1 and V1_ONLY_IF not in new

    def v1_only(source: str) -> bool:
        package = tmp_path / str(len(list(tmp_path.iterdir()))) / "sglang"
        (package / member).parent.mkdir(parents=True)
        (package / member).write_text(source)
        return adaptive_v1_only(package)

    assert v1_only(old) and not v1_only(new)
    assert not v1_only(old.replace(V1_ONLY_IF, "    if not server_args.disable_radix_cache:\n"))
    assert not v1_only(old.replace(V1_ONLY_IF, "    # if not server_args.disable_overlap_schedule:\n    if False:\n"))
    anchor = "    if server_args.enable_dp_attention:\n"
    assert v1_only(new.replace(anchor, V1_ONLY_IF + '        return "v1 only"\n' + anchor, 1))
    assert not v1_only("def adaptive_unsupported_reason(server_args):\n    return None\n")
    assert not v1_only("this is not python (")  # a broken file is no fact


def test_the_adaptive_refusal_is_asked_for_where_sglang_keeps_adaptive_on(site):
    def names(path: str, v1_only: bool) -> list[str]:
        sglang = replace(locate(str(site(adaptive=True)), sys.executable, dict(os.environ)), adaptive_v1_only=v1_only)
        return [case.name for case in refusal_cases(sglang, path)]

    assert "adaptive" in names("v2", False) and "adaptive" in names("v1", True)
    assert "adaptive" not in names("v2", True)


# Where ServerArgs declares the field: the monolithic file, or 0.5.20+'s observability group
GC_MEMBERS = ["srt/server_args.py", "srt/arg_groups/fields/observability.py"]


@pytest.mark.parametrize("version", RELEASES)
def test_every_release_but_0_4_10_logs_its_long_collections(version):
    """A release fact: --gc-warning-threshold-secs, which the proof passes where it exists."""
    package = releases.unpacked(version, GC_MEMBERS) / "sglang"
    assert gc_warning_supported(package) == (version != "0.4.10.post2")


def test_the_gc_warning_support_is_the_field_not_a_mention(site):
    pkg = site(gc_warning=True) / "sglang"
    assert gc_warning_supported(pkg) and locate(str(pkg), sys.executable, dict(os.environ)).gc_warning_supported
    old = site() / "sglang"  # control: a mention is no declaration
    with (old / "srt" / "server_args.py").open("a") as f:
        f.write('    x = "--gc-warning-threshold-secs"  # gc_warning_threshold_secs\n')
    assert not gc_warning_supported(old)
