"""`pip install --no-build-isolation .` into a fresh virtual environment, offline, packaging the module this
build made (MEMCALC_PYTHON_BUILT: setup.py compiles nothing then); the installed module gives the program's JSON."""
import json
import os
import shutil
import subprocess
import sys

import memcalc


def test_installs_into_a_virtual_environment(program, source_dir, tmp_path):
    # A copy of what setup.py reads, so that the install leaves nothing in the source tree.
    project = tmp_path / "project"
    (project / "python").mkdir(parents=True)
    for name in ("setup.py", "pyproject.toml", "CMakeLists.txt"):
        shutil.copy(os.path.join(source_dir, name), project / name)
    shutil.copytree(os.path.join(source_dir, "python", "memcalc"), project / "python" / "memcalc",
                    ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    venv = tmp_path / "venv"
    # Debian's setuptools and wheel, seen from the environment (pip then downloads nothing)
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    built = os.path.dirname(os.path.dirname(os.path.abspath(memcalc._memcalc.__file__)))
    env = dict(os.environ, MEMCALC_PYTHON_BUILT=built, PIP_NO_INDEX="1")
    env.pop("PYTHONPATH", None)
    subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "--no-build-isolation", "--no-index", "."],
                   cwd=project, env=env, check=True)
    script = ("import json, memcalc; print(memcalc.__file__); "
              "print(json.dumps(memcalc.estimate(preset='llama-7b', seq=4096, recompute='selective')))")
    p = subprocess.run([str(venv / "bin" / "python"), "-c", script], cwd=tmp_path, env=env,
                       capture_output=True, text=True, check=True)
    where, result = p.stdout.splitlines()
    assert where.startswith(str(venv))
    assert json.loads(result) == program.json(["--preset", "llama-7b", "--seq", "4096", "--recompute", "selective"])
