"""Ships ``grammar/xtml.lark`` inside the wheel as ``xtml/grammar/xtml.lark``.

The grammar is the language's definition and stays a top-level data folder
beside spec.md, so it is not a package of its own. Package data must live
under a package, and setuptools' configuration can only map a whole package
onto a folder (which makes a plain checkout on PYTHONPATH miss it), so the
build copies the file in. Editable installs and plain checkouts read the file
where it is (xtml.markup.reference.grammar_text).
"""

from __future__ import annotations

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

GRAMMARS = Path(__file__).parent / "grammar"


class BuildPyWithGrammar(build_py):
    def run(self) -> None:
        super().run()
        target = Path(self.build_lib, "xtml", "grammar")
        self.mkpath(str(target))
        for source in sorted(GRAMMARS.glob("*.lark")):
            self.copy_file(str(source), str(target / source.name))


setup(cmdclass={"build_py": BuildPyWithGrammar})
