"""Plugins: the built-in media plugins, a third-party plugin installed with pip,
and what fails at load time (clashes, grammar conflicts, unbalanced markup)."""

from __future__ import annotations

import base64
import io
import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import xtml
import xtml.plugins
import xtml.testing as xt
from tests.helpers.cli import run
from tests.helpers.media import user, wav
from tests.helpers.tokenizers import deepseek_path
from xtml.chat.template_file import builtin_files
from xtml.markup.sink import MarkupSink
from xtml.plugins import ContentExtension, Context
from xtml.plugins.media import Grid
from xtml.testing.validate import validate

BASE = xtml.load("xtml-base")
K3_TEXT = builtin_files()["kimi-k3"].read_text(encoding="utf-8")
BASE_TEXT = builtin_files()["xtml-base"].read_text(encoding="utf-8")


def files_allowed(tmp: Path) -> xtml.Template:
    """xtml-base with reading local media files switched on."""
    path = tmp / "files.toml"
    path.write_text(BASE_TEXT.replace("[plugins.image]\n", "[plugins.image]\nread_files = true\n")
                    .replace("[plugins.audio]\n", "[plugins.audio]\nread_files = true\n"), encoding="utf-8")
    return xtml.load(path)


@pytest.fixture(scope="module")
def base_vocab() -> xtml.Vocabulary:
    return xtml.load_tokenizer(deepseek_path(), add_special_tokens=BASE.markers.all())


def png(width: int, height: int) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (width, height)).save(buf, "PNG")
    return buf.getvalue()


def roundtrip(t: xtml.Template, req: dict[str, Any], vocab: xtml.Vocabulary) -> dict[str, Any]:
    want = t.normalize(req)
    assert t.parse(t.encode(req, vocab), vocab) == want
    assert t.parse(t.render(req).text) == want
    return want


# -- the patch grid ------------------------------------------------------------------

def test_grid_matches_hand_computed_sizes() -> None:
    g = Grid(patch_size=14, merge_size=2, min_pixels=56 * 56, max_pixels=28 * 28 * 1280)
    assert g.resize(28, 28) == (56, 56) and g.tokens(28, 28) == 4  # scaled up to min_pixels
    assert g.resize(640, 480) == (644, 476) and g.tokens(640, 480) == 46 * 34 // 4
    w, h = g.resize(8000, 6000)  # scaled down under max_pixels
    assert w * h <= g.max_pixels and w % 28 == 0 and h % 28 == 0
    assert g.tokens(8000, 6000) == (w // 14) * (h // 14) // 4 <= 1280


@given(st.integers(1, 10**12), st.integers(1, 10**12))
def test_grid_invariants(w: int, h: int) -> None:
    g = Grid(14, 2, 3136, 1003520)
    rw, rh = g.resize(w, h)
    assert rw % 28 == 0 and rh % 28 == 0 and rw >= 28 and rh >= 28
    assert rw * rh <= g.max_pixels  # whatever the aspect ratio
    assert g.tokens(w, h) <= g.max_pixels // (14 * 14 * 4)
    if 200 <= min(w, h) and max(w, h) / min(w, h) < 50:
        assert rw * rh >= g.min_pixels
        assert math.isclose(rw / rh, w / h, rel_tol=0.35)


# -- images --------------------------------------------------------------------------

def test_image_sizes_from_part_data_url_and_file(base_vocab: xtml.Vocabulary, tmp_path: Path) -> None:
    f = tmp_path / "shot.png"
    f.write_bytes(png(300, 200))
    req = user({"type": "image", "width": 640, "height": 480},
               {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(
                   png(100, 50)).decode()}},
               {"type": "input_image", "image_url": f"file://{f}"},
               {"type": "image", "image": str(f)},
               {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}})
    got = roundtrip(files_allowed(tmp_path), req, base_vocab)["messages"][0]["content"][1:]
    assert got == [{"type": "image", "width": 640, "height": 480}, {"type": "image", "width": 100, "height": 50},
                   {"type": "image", "width": 300, "height": 200}, {"type": "image", "width": 300, "height": 200},
                   {"type": "image"}]  # a remote URL: size unknown, the placeholder
    # By default a request cannot make the renderer read local files.
    got = BASE.normalize(req)["messages"][0]["content"][1:]
    assert got[2:] == [{"type": "image"}] * 3
    text = BASE.render(req).text
    pad = "<|x_pad|>"
    assert f"<|x_media|>image 640x480{pad * 391}<|x_media_end|>" in text
    assert text.count("<|x_image|>") == 3


def test_k3_keeps_the_placeholder_whatever_the_size(k3: xtml.Template) -> None:
    req = user({"type": "image", "width": 640, "height": 480})
    assert "<|kimi_image_placeholder|>" in k3.render(req).text
    assert k3.normalize(req)["messages"][0]["content"][1] == {"type": "image"}


def test_image_prompts_that_the_template_computes_read_back_as_sizes(base_vocab: xtml.Vocabulary) -> None:
    ext = BASE.dialect.plugins["image"]
    req = user({"type": "image"}) | {"image_prompts": [ext.prompt_for(56, 56)]}
    assert roundtrip(BASE, req, base_vocab)["messages"][0]["content"][1] == {"type": "image", "width": 56,
                                                                            "height": 56}
    other = user({"type": "image"}) | {"image_prompts": ["<|x_media|>image 56x56<|x_pad|><|x_media_end|>"]}
    n = roundtrip(BASE, other, base_vocab)
    assert n["image_prompts"] == other["image_prompts"]


@pytest.mark.parametrize("part, message", [
    ({"type": "image", "width": 10}, "both width and height"),
    ({"type": "image", "width": 0, "height": 5}, "positive integer"),
    ({"type": "image_url", "image_url": {"url": "data:image/png;base64,@@@"}}, "base64"),
    ({"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}, "not an image format Pillow reads"),
    ({"type": "audio"}, "needs its duration"),
    ({"type": "audio", "duration": -1}, "positive number"),
    ({"type": "audio", "duration": 10_000}, "max_seconds"),
    ({"type": "input_audio", "input_audio": {"data": "AAAA", "format": "mp3"}}, "cannot be read"),
    ({"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}, "not readable WAV audio: the data"),
    ({"type": "video", "frames": 3}, "width and height"),
    ({"type": "video", "width": 64, "height": 64}, r"frames \(sampled\) or duration"),
    ({"type": "video", "width": 64, "height": 64, "frames": 99}, "max_frames"),
    ({"type": "hologram"}, "not supported by this template"),
])
def test_bad_media_parts_are_located_errors(part: dict[str, Any], message: str) -> None:
    with pytest.raises(xtml.MessageError, match=message) as e:
        BASE.render(user(part))
    assert e.value.index == 0 and e.value.path == "content[1]"


# -- audio and video -------------------------------------------------------------------

def test_audio_round_trips_with_its_pad_count(base_vocab: xtml.Vocabulary, tmp_path: Path) -> None:
    f = tmp_path / "a.wav"
    f.write_bytes(wav(2.0))
    req = user({"type": "audio", "duration": 1.234},
               {"type": "input_audio", "input_audio": {"data": base64.b64encode(wav(0.5)).decode(), "format": "wav"}},
               {"type": "audio", "audio": str(f)})
    got = roundtrip(files_allowed(tmp_path), req, base_vocab)["messages"][0]["content"][1:]
    assert got == [{"type": "audio", "duration": 1.23}, {"type": "audio", "duration": 0.5},
                   {"type": "audio", "duration": 2.0}]
    with pytest.raises(xtml.MessageError, match="needs its duration"):
        BASE.render(req)  # the file may not be read: its length is unknown
    text = files_allowed(tmp_path).render(req).text
    assert "<|x_media|>audio 1.23s" + "<|x_pad|>" * math.ceil(1.23 * 12.5) + "<|x_media_end|>" in text


def test_video_frames_times_pads_per_frame(base_vocab: xtml.Vocabulary) -> None:
    req = user({"type": "video", "duration": 3.0, "width": 320, "height": 240},
               {"type": "video_url", "frames": 2, "width": 28, "height": 28})
    got = roundtrip(BASE, req, base_vocab)["messages"][0]["content"][1:]
    assert got == [{"type": "video", "frames": 6, "width": 320, "height": 240},
                   {"type": "video", "frames": 2, "width": 28, "height": 28}]
    per = BASE.dialect.plugins["video"].grid.tokens(320, 240)
    assert f"<|x_media|>video 6x320x240{'<|x_pad|>' * (6 * per)}<|x_media_end|>" in BASE.render(req).text


def test_wrong_pad_count_is_reported(base_vocab: xtml.Vocabulary) -> None:
    bad = ('<|x_open|>msg role="user"<|x_sep|><|x_media|>audio 1.00s<|x_pad|><|x_media_end|>'
           "<|x_close|>msg<|x_sep|><|x_eom|>")
    with pytest.raises(xtml.ParseError, match="pads"):
        BASE.parse(bad)
    out = BASE.parse(bad, lenient=True)
    assert out["messages"][0]["content"] == [{"type": "audio", "duration": 1.0}]
    assert [d["kind"] for d in out["diagnostics"]] == ["bad-embed"]


@settings(max_examples=60)
@given(xt.requests(BASE))
def test_generated_requests_with_media_round_trip(base_vocab: xtml.Vocabulary, request_: dict[str, Any]) -> None:
    xt.check_round_trip(BASE, request_, base_vocab)


# -- a third-party plugin, installed with pip --------------------------------------------

CITE_TEXT = K3_TEXT + '\n[plugins.citation]\nelement = "cite"\n'


@pytest.fixture(scope="module")
def cited(tmp_path_factory: pytest.TempPathFactory) -> Path:
    assert "citation" in xtml.plugins.installed(), (
        "install the example plugin: pip install ./examples/plugins/xtml-citation (the README's setup does)")
    path = tmp_path_factory.mktemp("cite") / "cited.toml"
    path.write_text(CITE_TEXT, encoding="utf-8")
    return path


def test_citation_plugin_renders_and_parses(cited: Path, vocab: xtml.Vocabulary) -> None:
    t = xtml.load(cited)
    req = {"messages": [
        {"role": "user", "content": [{"type": "text", "text": "As written in "},
                                     {"type": "citation", "source": "https://x.org/?a=1&b=\"2\"",
                                      "text": "to be <|close|>cite<|sep|> or not"}]},
        {"role": "assistant", "content": [{"type": "citation", "source": "s", "text": "quoted"}]}]}
    text = t.render(req).text
    assert '<|open|>cite source="https://x.org/?a=1&amp;b=&quot;2&quot;"<|sep|>' in text
    # A marker literal in the cited text: only token ids read it back whole.
    got = t.parse(t.encode(req, vocab), vocab)
    assert got == t.normalize(req)
    assert got["messages"][0]["content"][1] == req["messages"][0]["content"][1]
    assert got["messages"][1]["content"] == [{"type": "citation", "source": "s", "text": "quoted"}]


def test_citation_in_validate_and_fuzz(cited: Path) -> None:
    report = validate(cited, examples=80)
    assert report.valid, [f.line_text() for f in report.findings]
    code, out, err = run(["fuzz", "-t", str(cited), "--examples", "25", "--seed", "3"])
    assert code == 0, out + err
    bad = cited.with_name("bad-cite.toml")
    bad.write_text(CITE_TEXT.replace('element = "cite"', 'element = "no good"'), encoding="utf-8")
    code, out, _ = run(["validate", str(bad)])
    assert code == 1 and ": plugins.citation.element: element must be a valid XTML name" in out


def test_generated_requests_carry_citations(cited: Path) -> None:
    t = xtml.load(cited)
    found = xt.find_failure(xt.requests(t), lambda r: _no_citation(r), examples=400, seed=0)
    assert found.failure is not None  # the strategy does produce citation parts


def _no_citation(request: dict[str, Any]) -> None:
    if "citation" in json.dumps(request):
        raise AssertionError("a citation")


def test_citation_read_back_errors(cited: Path) -> None:
    t = xtml.load(cited)
    bad = ('<|open|>message role="user"<|sep|><|open|>cite source="a" page="2"<|sep|>x<|close|>cite<|sep|>'
           "<|close|>message<|sep|><|end_of_msg|>")
    with pytest.raises(xtml.ParseError, match="'cite' takes no attribute 'page'"):
        t.parse(bad)
    out = t.parse(bad, lenient=True)
    assert out["messages"][0]["content"] == "x" and out["diagnostics"][0]["kind"] == "bad-element"


# -- what fails at load time ------------------------------------------------------------

class _Fake:
    def __init__(self, name: str, ext: ContentExtension) -> None:
        self.name = name
        self.ext = ext

    def configure(self, settings: Mapping[str, Any], where: str) -> ContentExtension:
        return self.ext


class _Ext(ContentExtension):
    def __init__(self, name: str, part_types: tuple[str, ...] = (), elements: tuple[str, ...] = (),
                 grammar: str | None = None) -> None:
        self.name = name
        self.part_types = part_types
        self.elements = elements
        self.grammar = grammar

    def render(self, value: Any, out: MarkupSink, ctx: Context) -> None:
        out.open(self.elements[0] if self.elements else "x")  # never closed


def _with(tmp: Path, *plugins: _Fake) -> Path:
    for p in plugins:
        xtml.plugins.use(p)  # each test starts with none of them (tests/conftest.py)
    path = tmp / "t.toml"
    path.write_text(K3_TEXT + "".join(f"\n[plugins.{p.name}]\n" for p in plugins), encoding="utf-8")
    return path


def test_two_plugins_claiming_one_part_type_fail_at_load(tmp_path: Path) -> None:
    path = _with(tmp_path, _Fake("clash-a", _Ext("clash-a", ("sticker",))),
                 _Fake("clash-b", _Ext("clash-b", ("sticker",))))
    with pytest.raises(xtml.TemplateError, match="'sticker' is claimed by plugins 'clash-a' and 'clash-b'"):
        xtml.load(path)
    code, out, _ = run(["validate", str(path)])
    assert code == 1 and "plugins.clash-b" in out


def test_plugin_elements_cannot_take_template_names(tmp_path: Path) -> None:
    path = _with(tmp_path, _Fake("steal", _Ext("steal", ("steal",), ("think",))))
    with pytest.raises(xtml.TemplateError, match="which this template uses for think"):
        xtml.load(path)


def test_conflicting_grammar_fragments_fail_at_load(tmp_path: Path) -> None:
    ok = _Fake("frag-ok", _Ext("frag-ok", grammar="%extend embed: EMBED_INNER"))
    assert "EMBED_INNER" in xtml.load(_with(tmp_path, ok)).dialect.grammar.split("// plugin frag-ok")[1]
    also = _Fake("frag-also", _Ext("frag-also", grammar="%extend _content: EMBED_INNER"))
    with pytest.raises(xtml.TemplateError, match="grammar fragments of plugins 'frag-ok', 'frag-also' conflict"):
        xtml.load(_with(tmp_path, ok, also))
    alone = _Fake("frag-bad", _Ext("frag-bad", grammar="%extend embed: EMBED_MARK EMBED_MARK"))
    with pytest.raises(xtml.TemplateError, match="plugin 'frag-bad'"):
        xtml.load(_with(tmp_path, alone))


def test_plugin_markup_must_be_balanced(tmp_path: Path) -> None:
    t = xtml.load(_with(tmp_path, _Fake("leaky", _Ext("leaky", ("leaky",), ("leak",)))))
    with pytest.raises(xtml.TemplateError, match="left 1 element"):
        t.render([{"role": "user", "content": [{"type": "leaky"}]}])


# -- the docs --------------------------------------------------------------------------

def test_plugin_written_from_the_docs_behaves_like_the_package() -> None:
    import re

    from xtml.markup.segments import to_text
    from xtml.markup.sink import TreeSink

    doc = (Path(__file__).parent.parent / "docs" / "plugins.md").read_text(encoding="utf-8")
    code = re.search(r"```python\n(.*?)```", doc, re.S)
    assert code is not None
    ns: dict[str, Any] = {}
    exec(compile(code.group(1), "docs/plugins.md", "exec"), ns)
    from_docs = ns["plugin"].configure({}, "plugins.citation")
    installed = xtml.plugins.installed()["citation"].configure({}, "plugins.citation")
    k3 = xtml.load()
    for part in ({"type": "citation", "source": "https://x.org", "text": "to be"},
                 {"type": "citation", "source": 'a"&b', "text": ""}):
        trees = []
        for ext in (from_docs, installed):
            tb = TreeSink()
            ext.render(ext.prepare(part), tb, Context())
            trees.append(tb.finish())
            assert ext.read_element(trees[-1][0], Context()) == part
        assert trees[0] == trees[1]
    tb = TreeSink()
    from_docs.render(from_docs.prepare({"source": "https://x.org", "text": "to be"}), tb, Context())
    shown = to_text(tb.finish(), k3.markers)
    assert f"`{shown}`" in doc


class _Pinned(ContentExtension):
    name = "pinned"
    part_types = ("pin",)
    elements = ("pin",)
    attributes: ClassVar[dict[str, dict[str, type]]] = {"pin": {"lat": float, "zoom": int, "label": str}}

    def render(self, value: Any, out: MarkupSink, ctx: Context) -> None:
        out.element("pin", tuple((k, str(v)) for k, v in value.items() if k != "type"), "")

    def read_element(self, el: Any, ctx: Context) -> dict[str, Any] | None:
        return {"type": "pin", **{k: float(v) if k == "lat" else int(v) if k == "zoom" else v for k, v in el.attrs}}


def test_declared_attributes_are_checked_both_ways(tmp_path: Path) -> None:
    t = xtml.load(_with(tmp_path, _Fake("pinned", _Pinned())))
    good = [{"role": "user", "content": [{"type": "pin", "lat": 1.5, "zoom": 3}]}]
    assert t.parse(t.render(good).text)["messages"][0]["content"] == good[0]["content"]
    with pytest.raises(xtml.TemplateError, match="attribute 'zoom' of 'pin' must be an integer"):
        t.render([{"role": "user", "content": [{"type": "pin", "zoom": 2.5}]}])
    with pytest.raises(xtml.TemplateError, match="'pin' takes no attribute 'alt'"):
        t.render([{"role": "user", "content": [{"type": "pin", "alt": 1}]}])
    bad = ('<|open|>message role="user"<|sep|><|open|>pin lat="north"<|sep|><|close|>pin<|sep|>'
           "<|close|>message<|sep|><|end_of_msg|>")
    with pytest.raises(xtml.ParseError, match="attribute 'lat' of 'pin' must be a number"):
        t.parse(bad)


def test_local_files_when_allowed(tmp_path: Path) -> None:
    t = files_allowed(tmp_path)
    with pytest.raises(xtml.MessageError, match="image file not found") as missing:
        t.render(user({"type": "image", "image": str(tmp_path / "none.png")}))
    (tmp_path / "x.txt").write_text("not an image")
    with pytest.raises(xtml.MessageError, match="image file not found") as not_an_image:
        t.render(user({"type": "image", "image": str(tmp_path / "x.txt")}))
    # One message for both: an error must not tell which paths exist.
    assert str(missing.value).replace("none.png", "x.txt") == str(not_an_image.value)


def test_plugin_attribute_values_must_be_strings(tmp_path: Path) -> None:
    class Typed(_Pinned):
        def render(self, value: Any, out: MarkupSink, ctx: Context) -> None:
            out.element("pin", (("lat", 1.5),), "")  # type: ignore[arg-type]

    t = xtml.load(_with(tmp_path, _Fake("typed-pin", Typed())))
    with pytest.raises(xtml.TemplateError, match="attribute names and values are strings"):
        t.render([{"role": "user", "content": [{"type": "pin"}]}])


@pytest.mark.parametrize("lines, key, message", [
    ('placeholder = "<|kimi_image_placeholder|>"\npad = "<|media_pad|>"', "pad", "pad goes with prompt"),
    ('placeholder = "<|kimi_image_placeholder|>"\nprompt = "<|media_begin|>image {width}x{height}{pads}"',
     "pad", "pad must be a non-empty string"),
    ('placeholder = "<|kimi_image_placeholder|>"\nwrite_prompts = true', "write_prompts", "needs prompt"),
    ('placeholder = "<|kimi_image_placeholder|>"\npatch_size = 16', "patch_size", "write_prompts = true"),
    ('placeholder = "<|kimi_image_placeholder|>"\nprompt = "<|media_begin|>image {width}<|media_end|>"\n'
     'pad = "<|media_pad|>"', "prompt", r"\{height\}, \{pads\}, \{width\} once"),
])
def test_image_prompt_settings_are_checked_by_the_plugin(tmp_path: Path, lines: str, key: str, message: str) -> None:
    start, end = K3_TEXT.index("[plugins.image]\n"), K3_TEXT.index("[json_fallback]")
    path = tmp_path / "t.toml"
    path.write_text(K3_TEXT[:start] + "[plugins.image]\n" + lines + "\n\n" + K3_TEXT[end:], encoding="utf-8")
    with pytest.raises(xtml.TemplateError, match=message) as e:
        xtml.load(path)
    assert e.value.location is not None and e.value.location.endswith(f"plugins.image.{key}")


def test_k3_image_prompts_are_of_its_format() -> None:
    t = xtml.load()
    ok = "<|media_begin|>image 2x2<|media_content|>" + "<|media_pad|>" * 3 + "<|media_end|>"
    req = user({"type": "image"}) | {"image_prompts": [ok]}
    assert ok in t.render(req).text
    for bad in (ok + "\n", ok[:-1], ok.replace("2x2", "2x"), ok.replace("<|media_pad|>", "<|media_content|>"),
                "<|kimi_image_placeholder|>"):
        with pytest.raises(xtml.OptionError, match="not an image prompt of this format"):
            t.render(user({"type": "image"}) | {"image_prompts": [bad]})


def test_k3_can_write_processor_prompts_when_sizes_are_known(tmp_path: Path, vocab: xtml.Vocabulary) -> None:
    path = tmp_path / "k3-sized.toml"
    path.write_text(K3_TEXT.replace("[plugins.image]\n", "[plugins.image]\nwrite_prompts = true\n"),
                    encoding="utf-8")
    t = xtml.load(path)
    req = user({"type": "image_url", "image_url": {"url": "https://x/cat.png"}, "width": 1024, "height": 768})
    text = t.render(req).text
    prompt = "<|media_begin|>image 1024x768<|media_content|>" + "<|media_pad|>" * Grid(
        14, 2, 3136, 1003520).tokens(1024, 768) + "<|media_end|>"
    assert prompt in text
    assert t.dialect.image_prompt.match(prompt)  # also a valid image_prompts prompt for K3
    assert roundtrip(t, req, vocab)["messages"][0]["content"][1] == {"type": "image", "width": 1024, "height": 768}
    # The shipped K3 template keeps the reference encoder's placeholder.
    assert "<|kimi_image_placeholder|>" in xtml.load().render(req).text
