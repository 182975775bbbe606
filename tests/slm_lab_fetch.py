"""SLM-Lab's own spec files for the tests: ``$SLM_LAB_SPECS`` when set, else a checked download into a cache.

The tests that read SLM-Lab's spec files (marked ``slm_lab_specs``) find them under one root laid out as
``ROOT/v5.3.0/...`` and ``ROOT/v4.2.4/...``: each version folder is SLM-Lab's ``slm_lab/spec/`` folder at the
pinned commit (``VERSIONS``), its data and spec files only (the ``*.py`` files are left out).

* ``$SLM_LAB_SPECS`` set: that folder is the root, used as it is (it must hold the version folders asked for).
* Otherwise the root is ``$XDG_CACHE_HOME/rl-trial-lab/slm_lab_specs`` (``~/.cache/...``). A version folder
  missing there, or whose files no longer match, is downloaded: GitHub's archive of the commit
  (``ARCHIVE_URL``, or ``$SLM_LAB_SPECS_URL``, a URL with ``{commit}`` in it, ``file://`` included), streamed,
  and only the files listed in ``tests/fixtures/slm_lab_specs.sha256`` are kept, each checked against its
  sha256 there. The folder appears whole (written beside it, then renamed) or not at all.

Any failure (no network, a file whose hash differs, a file missing from the archive) raises
``SpecsUnavailable`` with one line that names what to set; ``tests/conftest.py`` ends the test session with it.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tarfile
import urllib.error
import urllib.request
from pathlib import Path

# SLM-Lab (github.com/kengz/SLM-Lab) releases whose spec files the tests read: version folder -> commit
VERSIONS = {"v5.3.0": "96be3938d3239edb595f41190ae2ae035d83c65a",
            "v4.2.4": "667ba73349ad00c6f4b3e428dcd10eebbdab4c70"}
ARCHIVE_URL = "https://codeload.github.com/kengz/SLM-Lab/tar.gz/{commit}"
URL_VAR = "SLM_LAB_SPECS_URL"
ROOT_VAR = "SLM_LAB_SPECS"
SPEC_DIR = "slm_lab/spec/"  # where the spec files live in SLM-Lab's repository
SHA256_LIST = Path(__file__).resolve().parent / "fixtures" / "slm_lab_specs.sha256"
TIMEOUT_S = 60.0  # per network read


class SpecsUnavailable(RuntimeError):
    """SLM-Lab's spec files cannot be had; the message is one line naming the cause and ``SLM_LAB_SPECS``."""


def cache_root() -> Path:
    """Where downloaded versions are kept: ``$XDG_CACHE_HOME`` (else ``~/.cache``) ``/rl-trial-lab/slm_lab_specs``."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "rl-trial-lab" / "slm_lab_specs"


def specs_root() -> Path:
    """The root the tests read (``$SLM_LAB_SPECS``, else ``cache_root()``); only a path, nothing is checked."""
    return Path(os.environ[ROOT_VAR]) if os.environ.get(ROOT_VAR) else cache_root()


def expected(version: str, listing: Path | None = None) -> dict[str, str]:
    """``{path inside the version folder: sha256 hex}`` of one version, from the repository's sha256 list
    (``listing``, default ``SHA256_LIST``; ``sha256sum`` format, paths ``VERSION/...``). Raises KeyError for a
    version the list does not have."""
    listing = listing or SHA256_LIST
    files = {}
    for line in listing.read_text().splitlines():
        digest, path = line.split(maxsplit=1)
        head, _, rel = path.partition("/")
        if head == version:
            files[rel] = digest
    if not files:
        raise KeyError(f"{listing} lists no file of {version}")
    return files


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _matches(folder: Path, files: dict[str, str]) -> bool:
    """True when every listed file is in ``folder`` with its listed hash."""
    return all((folder / rel).is_file() and _sha256(folder / rel) == digest for rel, digest in files.items())


def _hint() -> str:
    return (f"set {ROOT_VAR} to a folder holding SLM-Lab's spec files as v5.3.0/ (its slm_lab/spec/ at commit "
            f"{VERSIONS['v5.3.0'][:8]}), see docs/getting-started.md")


def download(version: str, root: Path, listing: Path | None = None) -> Path:
    """Download ``version``'s spec files into ``root/version`` (replacing what is there) and return that folder.

    Streams the archive of ``VERSIONS[version]`` (top folder of any name, then SLM-Lab's own layout), keeps the
    regular files under ``slm_lab/spec/`` that the list names, each checked against its sha256. Raises
    SpecsUnavailable (one line) when the archive cannot be read, a file's hash differs (naming the file), or a
    listed file is missing from the archive."""
    listing = listing or SHA256_LIST
    files = expected(version, listing)
    url = os.environ.get(URL_VAR, ARCHIVE_URL).format(commit=VERSIONS[version])
    root.mkdir(parents=True, exist_ok=True)
    partial = root / f".{version}.partial-{os.getpid()}"
    shutil.rmtree(partial, ignore_errors=True)
    seen = set()
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as response, \
                tarfile.open(fileobj=response, mode="r|gz") as archive:
            for member in archive:
                inner = member.name.partition("/")[2]  # below the top folder (any name)
                rel = inner[len(SPEC_DIR):] if inner.startswith(SPEC_DIR) else None
                if not member.isfile() or rel not in files:
                    continue
                data = archive.extractfile(member).read()
                digest = hashlib.sha256(data).hexdigest()
                if digest != files[rel]:
                    raise SpecsUnavailable(f"SLM-Lab spec file {version}/{rel} from {url} has sha256 {digest}, "
                                           f"not {files[rel]} as {listing.name} lists: refused; {_hint()}")
                (partial / rel).parent.mkdir(parents=True, exist_ok=True)
                (partial / rel).write_bytes(data)
                seen.add(rel)
        missing = sorted(set(files) - seen)
        if missing:
            raise SpecsUnavailable(f"the archive {url} lacks {len(missing)} listed SLM-Lab spec file(s) of {version} "
                                   f"({SPEC_DIR}{missing[0]}, ...); {_hint()}")
        folder = root / version
        shutil.rmtree(folder, ignore_errors=True)
        try:
            os.replace(partial, folder)
        except OSError:  # another test session put a whole folder there first
            if not _matches(folder, files):
                raise
        return folder
    except (urllib.error.URLError, OSError, tarfile.TarError, EOFError) as err:
        reason = getattr(err, "reason", None) or err
        raise SpecsUnavailable(f"SLM-Lab's spec files ({version}) could not be downloaded from {url} "
                               f"({type(err).__name__}: {reason}); {_hint()}") from None
    finally:
        shutil.rmtree(partial, ignore_errors=True)


def ensure(versions: tuple[str, ...] = ("v5.3.0",)) -> Path:
    """The root holding ``versions``: ``$SLM_LAB_SPECS`` (each version folder must be there), else the cache,
    downloading each version whose files are missing or differ from the list. Raises SpecsUnavailable."""
    if os.environ.get(ROOT_VAR):
        root = specs_root()
        absent = [v for v in versions if not (root / v).is_dir()]
        if absent:
            raise SpecsUnavailable(f"{ROOT_VAR}={root} holds no {absent[0]}/ folder; {_hint()}")
        return root
    root = cache_root()
    for version in versions:
        if not _matches(root / version, expected(version)):
            download(version, root)
    return root
