"""The module's tests: memcalc (the build's python/ folder on PYTHONPATH) against the memcalc program."""
import json
import os
import subprocess

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


def pytest_addoption(parser):
    parser.addoption("--memcalc", default=os.environ.get("MEMCALC_PROGRAM", "build/memcalc"),
                     help="the memcalc program to compare with")
    parser.addoption("--source-dir", default=os.path.normpath(os.path.join(HERE, "..", "..")),
                     help="the repository (presets/, tests/configs/, setup.py)")


class Program:
    """The memcalc program, run as a subprocess."""

    def __init__(self, path):
        self.path = os.path.abspath(path)

    def run(self, args):
        p = subprocess.run([self.path, *args], capture_output=True, text=True, check=False)
        return p.returncode, p.stdout, p.stderr

    def json(self, args):
        status, out, err = self.run([*args, "--format", "json"])
        assert status == 0, err
        return json.loads(out)


@pytest.fixture(scope="session")
def program(request):
    return Program(request.config.getoption("--memcalc"))


@pytest.fixture(scope="session")
def source_dir(request):
    return os.path.abspath(request.config.getoption("--source-dir"))


def pytest_generate_tests(metafunc):
    if "preset" in metafunc.fixturenames:  # every preset the program lists
        names = [p["name"] for p in Program(metafunc.config.getoption("--memcalc")).json(["presets"])]
        metafunc.parametrize("preset", names)
