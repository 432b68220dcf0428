"""Shared fixtures: the tiny CLIP, scorers built on it, the sample clips and synthetic videos."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
# support code of the experiments that the tests share (the scenes world: ``import scenes_world``); not in the wheel
if str(REPO / "experiments") not in sys.path:
    sys.path.append(str(REPO / "experiments"))
# The device of the parity tests' scorers (tests marked ``device_parity``), read once: ``cpu`` unless
# CAPREWARD_TEST_DEVICE names another (``cuda``, ``cuda:1``); benchmarks/gpu_all.sh runs them on a GPU with
# ``CAPREWARD_TEST_DEVICE=cuda python3 -m pytest -m device_parity``. Their references stay on the CPU.
TEST_DEVICE = os.environ.get("CAPREWARD_TEST_DEVICE", "cpu")
SHARED = REPO.parent / "shared"
VIDEO_DIR = SHARED / "data" / "videos"


def sample_clips() -> list[Path]:
    return sorted(VIDEO_DIR.glob("*.mp4")) if VIDEO_DIR.is_dir() else []


@pytest.fixture(scope="session")
def real_clips() -> list[Path]:
    clips = sample_clips()
    if not clips:
        pytest.skip(f"sample clips not found in {VIDEO_DIR}")
    return clips


@pytest.fixture(scope="session")
def tiny_backbone():
    from capreward.backbones import CLIPBackbone
    from capreward.testing import tiny_clip_factory

    return CLIPBackbone(tiny_clip_factory(seed=0), device=TEST_DEVICE)


@pytest.fixture(scope="session")
def tiny_clip_path(tmp_path_factory) -> Path:
    from capreward.testing import save_tiny_clip_openai

    return save_tiny_clip_openai(tmp_path_factory.mktemp("clip") / "tiny_openai.pt", seed=0)


def random_video(seed: int, frames: int = 12, height: int = 40, width: int = 56) -> np.ndarray:
    """A uint8 (T, H, W, 3) clip of smooth random colour fields (so CLIP features differ per frame)."""
    rng = np.random.default_rng(seed)
    base = rng.integers(0, 256, size=(frames, 4, 4, 3)).astype(np.float32)
    up = np.kron(base, np.ones((1, height // 4 + 1, width // 4 + 1, 1), dtype=np.float32))[:, :height, :width]
    noise = rng.normal(0, 8, size=up.shape)
    return np.clip(up + noise, 0, 255).astype(np.uint8)


def write_mp4(path: Path, frames: np.ndarray, fps: int = 10) -> Path:
    """Encode uint8 frames (T, H, W, 3) to an H.264 mp4 with imageio-ffmpeg."""
    import imageio_ffmpeg

    t, h, w, _ = frames.shape
    writer = imageio_ffmpeg.write_frames(str(path), (w, h), fps=fps, macro_block_size=1, output_params=["-loglevel", "error"])
    writer.send(None)
    for frame in frames:
        writer.send(np.ascontiguousarray(frame))
    writer.close()
    return path


def write_job_media(directory: Path) -> tuple[Path, Path]:
    """One PNG image and one 8-frame mp4 in ``directory``, the media of the score-job tests."""
    from PIL import Image

    image = directory / "im.png"
    Image.fromarray(random_video(3, frames=1)[0]).save(image)
    return image, write_mp4(directory / "v.mp4", random_video(4, frames=8))


def import_script(path: Path, name: str):
    """Import a standalone script (a recipe or an experiment) as the module ``name``, registered in
    ``sys.modules`` so that its dataclasses and pickled objects resolve; returns the module."""
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


# ------------------------------------------------------------------------------ the version matrix, early
#: The test whose oldest end starts in the background as soon as the session has collected it.
MATRIX_TEST = "test_version_matrix.py::test_integration_tests_pass_at_the_oldest_and_newest_versions"
#: What the background run left for the test: its pid, log, exit-status file and the run's id.
MATRIX_STATE = REPO / ".matrix" / "oldest-background.json"


def run_id(config) -> str:
    """One id per test run, the same in every pytest-xdist worker (their ``testrunuid``)."""
    workerinput = getattr(config, "workerinput", None)
    return workerinput["testrunuid"] if workerinput else config._capreward_run_id


def pytest_configure(config) -> None:
    """The controller (or the only process) fills the fixture cache from the repository's trained judges
    (tests/train_fixtures.py) and names the run; with pytest-xdist the workers get the name."""
    import uuid

    if getattr(config, "workerinput", None) is None:
        from train_fixtures import seed_cache

        seed_cache()  # the trained judges the repository keeps, into the cache where missing (before any worker)
        config._capreward_run_id = getattr(config.option, "testrunuid", None) or uuid.uuid4().hex
        if hasattr(config.option, "testrunuid"):
            config.option.testrunuid = config._capreward_run_id
        # ``-n N`` alone sends each file whole to one worker (module-scoped fixtures built once); an explicit
        # ``--dist`` wins. (Not in addopts: a pytest without xdist, as on the GPU image, would refuse it.)
        explicit = any(a == "--dist" or a.startswith("--dist=") for a in config.invocation_params.args)
        if getattr(config.option, "dist", None) == "load" and not explicit:
            config.option.dist = "loadfile"
        # files go out in collection order (pytest_collection_modifyitems), not most tests first
        if not any(a.endswith("loadscope-reorder") for a in config.invocation_params.args):
            config.option.loadscopereorder = False


def pytest_collection_modifyitems(session, config, items) -> None:
    """Files run in the order their trained fixtures become ready, long files first within a tier
    (``train_fixtures.run_order``: those that need none first), and the version matrix's test last: it
    waits for the background run, which by then has had the whole suite's time. (Every xdist worker sorts
    alike: the order depends on the files only.)"""
    from train_fixtures import judges_ready, run_order

    judges = judges_ready()
    orders: dict[Path, tuple[int, int]] = {}

    def tier(item) -> tuple[int, int]:
        path = Path(str(item.fspath))
        if path not in orders:
            orders[path] = run_order(path, judges) if path.name.startswith("test_") else (0, 0)
        return orders[path]

    # its whole file last: pytest-xdist's --dist loadfile runs a file's tests together where the file first appears
    matrix_file = MATRIX_TEST.split("::")[0]
    items.sort(key=lambda item: (item.nodeid.split("::")[0].endswith(matrix_file), item.nodeid.endswith(MATRIX_TEST),
                                 tier(item)))


def pytest_collection_finish(session) -> None:
    """A run of most of the suite starts the fixture trainers (:func:`start_fixture_trainers`). When the
    session will run the version matrix, its oldest end (a pip install of every lower bound, then the
    integration tests there, once the fixture trainers are done: they read the judges the trainers wrote)
    starts now in the background, at a lower CPU priority, so that it runs beside the rest of the suite
    rather than after it; the test (in whichever worker runs it) waits for its exit status."""
    import json
    import subprocess

    if session.config.option.collectonly or not (REPO / ".venv" / "bin" / "python").exists():
        return
    if os.environ.get("PYTEST_XDIST_WORKER", "gw0") != "gw0":  # one worker starts them
        return
    trainers: list[int] = []
    if len(session.items) >= PREFETCH_FROM and not os.environ.get("CAPREWARD_TEST_NO_PREFETCH"):
        trainers = start_fixture_trainers(session)
    if not any(item.nodeid.endswith(MATRIX_TEST) for item in session.items):
        return
    log = REPO / ".matrix" / "oldest-background.log"
    status = REPO / ".matrix" / "oldest-background.rc"
    log.parent.mkdir(exist_ok=True)
    status.unlink(missing_ok=True)
    script = 'nice -n 10 bash "$1" oldest > "$2" 2>&1; echo $? > "$3.part" && mv "$3.part" "$3"'
    # its tests start once the trainers are done: they read the judges the trainers write (one cache, one
    # layout for every transformers version) rather than train their own
    env = {**os.environ, "CAPREWARD_MATRIX_AFTER_PIDS": " ".join(map(str, trainers))}
    process = subprocess.Popen(["bash", "-c", script, "matrix", str(REPO / "scripts" / "version_matrix.sh"), str(log),
                                str(status)], cwd=REPO, stdin=subprocess.DEVNULL, start_new_session=True, env=env)
    MATRIX_STATE.write_text(json.dumps({"pid": process.pid, "log": str(log), "status": str(status),
                                        "run": run_id(session.config)}))


#: a run that collects at least this many tests trains the fixtures ahead (tests/train_fixtures.py)
PREFETCH_FROM = 1000


def fixtures_state(config) -> Path:
    import tempfile

    return Path(tempfile.gettempdir()) / f"capreward-fixtures-{run_id(config)}.json"


def start_fixture_trainers(session) -> list[int]:
    """Two background processes train the trained fixtures (tests/train_fixtures.py) while the workers
    run the tests that need none: a worker reaching a fixture still training then waits on a process that
    is using the CPU, rather than one worker idling while the other trains. Output: .matrix/fixtures-*.log.
    Returns their process ids."""
    import json
    import subprocess

    logs = REPO / ".matrix"
    logs.mkdir(exist_ok=True)
    pids = []
    for group in ("a", "b"):
        with open(logs / f"fixtures-{group}.log", "wb") as out:
            pids.append(subprocess.Popen([sys.executable, str(REPO / "tests" / "train_fixtures.py"), group], cwd=REPO,
                                         stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True).pid)
    fixtures_state(session.config).write_text(json.dumps({"pids": pids}))
    return pids


def matrix_background(config) -> dict | None:
    """This run's background matrix run (see :func:`pytest_collection_finish`), else None."""
    import json

    try:
        state = json.loads(MATRIX_STATE.read_text())
    except (OSError, ValueError):
        return None
    return state if state.get("run") == run_id(config) else None


def stop_fixture_trainers(config) -> None:
    """Stops the fixture trainers a run started (a run that ended before they did)."""
    import json
    import signal

    state = fixtures_state(config)
    try:
        pids = json.loads(state.read_text())["pids"]
    except (OSError, ValueError, KeyError):
        return
    for pid in pids:
        try:
            os.killpg(pid, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            pass
    state.unlink(missing_ok=True)


def pytest_sessionfinish(session, exitstatus) -> None:
    """A background end still running when the run ends (the matrix test was not reached) is stopped, by
    the controller (or the only process), after every worker has finished."""
    import signal

    if getattr(session.config, "workerinput", None) is not None:
        return
    stop_fixture_trainers(session.config)
    state = matrix_background(session.config)
    if state is None or Path(state["status"]).exists():
        return
    try:
        os.killpg(state["pid"], signal.SIGTERM)
    except ProcessLookupError:
        pass
