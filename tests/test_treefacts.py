"""patcher/treefacts.py: where the package is, its layout and its versions, on real SGLang releases.

The same module answers for `dynspec apply` (patcher/tree.py), for servers (shipped with the remote
applier and in bundles) and for `dynspec proof` (patcher/proof/detect.py).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from patcher import releases, treefacts
from patcher.treefacts import NotATree, NothingImportable


def dist_info(package: Path, version: str) -> Path:
    """The release's own ``sglang-V.dist-info/METADATA`` from its wheel, next to the package dir."""
    name = f"sglang-{version}.dist-info/METADATA"
    with zipfile.ZipFile(releases.wheel(version)) as wheel:
        wheel.extract(name, package.parent)
    return package.parent / name


def test_each_layout_is_found_and_named(release_tree, tmp_path: Path) -> None:
    package = release_tree("0.5.12")
    checkout = tmp_path / "checkout"
    release_tree("0.5.12", where=checkout / "python")
    found = {spec: treefacts.locate(str(spec)) for spec in (package, package.parent, checkout, checkout / "python")}
    assert [(f.package_dir, f.layout) for f in found.values()] == [
        (str(package), "package dir"),
        (str(package), "python/"),
        (str(checkout / "python" / "sglang"), "checkout"),
        (str(checkout / "python" / "sglang"), "python/"),
    ]
    assert [f.root for f in found.values()] == [str(spec) for spec in found]


def test_the_directory_named_wins_over_a_package_inside_it(release_tree) -> None:
    outer = release_tree("0.5.12")
    inner = release_tree("0.5.23", where=outer)  # outer/sglang: a package inside the package dir
    assert treefacts.locate(str(outer)).package_dir == str(outer)
    (outer / "__init__.py").unlink()  # control: no longer a package itself, so the inner one is found
    assert treefacts.locate(str(outer)).package_dir == str(inner)


def test_what_is_not_a_tree_is_named_with_the_reason(release_tree, tmp_path: Path) -> None:
    package = release_tree("0.5.12")
    (tmp_path / "file").write_text("")
    cases = {
        str(tmp_path / "missing"): "no such directory",
        str(tmp_path / "file"): "not a directory",
        str(tmp_path): treefacts.EXPECTED,
    }
    for spec, why in cases.items():
        with pytest.raises(NotATree) as error:
            treefacts.locate(spec)
        assert (error.value.path, error.value.why) == (spec, why)
        assert str(error.value) == f"{spec} is not an SGLang tree: {why}"
    server_args = package / "srt" / "server_args.py"
    server_args.unlink()
    with pytest.raises(NotATree, match=r"srt/server_args\.py is missing$") as error:
        treefacts.locate(str(package))
    assert error.value.path == str(package)
    os.mkfifo(server_args)
    with pytest.raises(NotATree, match=r"srt/server_args\.py is not a regular file$"):
        treefacts.locate(str(package))


def test_a_directory_named_auto_is_a_path_to_locate_path(
    release_tree, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`dynspec bundle --from auto` means the directory ./auto, never the sglang Python imports."""
    package = release_tree("0.5.12", where=tmp_path / "auto")
    monkeypatch.chdir(tmp_path)
    assert treefacts.locate_path("auto").package_dir == str(package)
    with pytest.raises(NothingImportable):  # control: locate reads "auto" as --sglang auto
        treefacts.locate("auto")


def locate_auto(pythonpath: str | None) -> subprocess.CompletedProcess[str]:
    """``treefacts.locate("auto")`` in a fresh Python with this PYTHONPATH (or none)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    code = "from patcher import treefacts; f = treefacts.locate('auto'); print(f.package_dir, f.layout)"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)


def test_auto_is_the_sglang_this_python_would_import(release_tree) -> None:
    package = release_tree("0.5.12")
    found = locate_auto(str(package.parent))
    assert found.returncode == 0, found.stderr
    assert found.stdout.split() == [str(package), "auto"]
    nothing = locate_auto(None)  # control: the same Python without the site dir
    assert nothing.returncode != 0 and treefacts.NOTHING_IMPORTABLE in nothing.stderr


def test_the_first_search_location_holding_the_package_is_it(release_tree, tmp_path: Path) -> None:
    """A namespace package has several locations: ``sglang.srt`` comes from the one that holds it."""
    package = release_tree("0.5.12")
    empty = tmp_path / "portion"
    empty.mkdir()
    assert treefacts.package_among([str(empty), str(package)]) == str(package)
    with pytest.raises(NotATree, match="srt/server_args.py is missing") as error:
        treefacts.package_among([str(empty)])
    assert error.value.path == str(empty)
    with pytest.raises(NothingImportable):
        treefacts.package_among([])


# -- versions ----------------------------------------------------------------------------------


@pytest.mark.parametrize("version", ["0.4.10.post2", "0.5.12", "0.5.23"])
def test_a_release_states_its_own_version(release_tree, version: str) -> None:
    package = release_tree(version)
    sources = treefacts.read_versions(str(package))
    # 0.5.x's version.py imports _version.py (or asks importlib.metadata): it states no version itself
    assert sources == ({"version.py": version} if version.startswith("0.4") else {"_version.py": version})
    assert treefacts.read_version(str(package)) == version


def test_dist_info_is_read_from_its_header_and_loses_to_the_package_files(release_tree) -> None:
    package = release_tree("0.5.12")
    metadata = dist_info(package, "0.5.12")
    assert metadata.stat().st_size > 16384, "the real METADATA carries the README after its header"
    name = "sglang-0.5.12.dist-info"
    other = package.parent / "sglang-0.5.11.dist-info"
    shutil.copytree(metadata.parent, other)
    (other / "METADATA").write_text(metadata.read_text().replace("Version: 0.5.12", "Version: 0.5.11", 1))
    sources = treefacts.read_versions(str(package))
    assert sources == {"_version.py": "0.5.12", "sglang-0.5.11.dist-info": "0.5.11", name: "0.5.12"}
    (package / "_version.py").unlink()
    assert treefacts.read_version(str(package)) == "0.5.11", "the first dist-info, by name"
    shutil.rmtree(other)
    assert treefacts.read_version(str(package)) == "0.5.12"
    body_only = "Metadata-Version: 2.1\nName: sglang\n\nVersion: 9.9 is prose in the README\n"
    metadata.write_text(body_only)
    assert treefacts.read_version(str(package)) is None
    metadata.write_text(body_only.replace("\n\n", "\n", 1))  # control: the same line as a header is read
    assert treefacts.read_version(str(package)) == "9.9"


@pytest.mark.parametrize(
    ("source", "version"),
    [
        ("__version__ = version = '0.5.12'\n", "0.5.12"),
        ('__version__ = a = b = "1.2"\n', "1.2"),
        ("__version__: str = '1.3'\n", "1.3"),
        ("__version__ = ('1.4')\n", "1.4"),  # not the usual spelling: read from the AST
        ("__version__ = None\n", None),  # only a string is a version
        ("if True:\n    __version__ = '1.5'\n", None),  # not at module level
        ("__version__ = '1.6\n", None),  # not Python
        ("", None),
    ],
)
def test_a_version_file_is_read_never_run(source: str, version: str | None) -> None:
    assert treefacts.version_in_source(source.encode()) == version
