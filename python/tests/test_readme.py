"""The docs' Python page and the docstrings' examples, run as doctests: what they show is what the module gives."""
import doctest
import os
import re


def test_python_page_examples(source_dir):
    with open(os.path.join(source_dir, "docs", "python.md"), encoding="utf-8") as f:
        page = f.read()
    examples = re.findall(r"```python\n(.*?)```", page, re.S)
    assert examples
    parser = doctest.DocTestParser()
    runner = doctest.DocTestRunner(optionflags=doctest.NORMALIZE_WHITESPACE)
    for i, text in enumerate(examples):
        runner.run(parser.get_doctest(text, {}, f"docs/python.md example {i + 1}", "docs/python.md", 0))
    result = runner.summarize(verbose=False)
    assert result.attempted > 0 and result.failed == 0


def test_docstring_examples():
    import memcalc
    result = doctest.testmod(memcalc, extraglobs={"memcalc": memcalc}, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 10 and result.failed == 0
