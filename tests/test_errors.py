"""capreward's error model: one root exception (every error class derives from it and keeps its builtin
base), and the CLI's translation of any such error into one line and exit status 2."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import warnings

import pytest

import capreward
from capreward.errors import CaprewardError

#: Every exception class of the package and the builtin class it derived from before the root existed
#: (read from the code before the change): ``except <builtin>`` in user code must keep catching it.
BUILTIN_BASES = {
    "capreward._extras.MissingExtraError": ModuleNotFoundError,
    "capreward.server.batching.Busy": Exception,
    "capreward.json_limits.JSONLimitError": ValueError,
    "capreward.adapters.labels.LabelError": ValueError,
    "capreward.server.http.RequestError": Exception,
    "capreward.server.http._HeadersTooLarge": Exception,
    "capreward.adapters.paths.PathRefused": ValueError,
    "capreward.backbones.clip_loading.ModelLoadError": RuntimeError,
    "capreward.cli.common.CLIError": Exception,
    "capreward.devices.DeviceUnavailableError": ValueError,
    "capreward.hub.ModelNotAvailable": OSError,
    "capreward.jobs.errors.JobError": Exception,
    "capreward.jobs.idf_file.IdfMismatch": Exception,
    "capreward.jobs.manifest.ManifestError": ValueError,
    "capreward.jobs.output_lock.OutputLocked": Exception,
    "capreward.locks.LockBusy": TimeoutError,  # new: a lock not free within its timeout, naming the holder
    "capreward.jobs.results_file.DiskError": Exception,
    "capreward.jobs.results_file.ResultsCorrupt": Exception,
    "capreward.jobs.row_inputs.ChangedInputs": Exception,
    "capreward.jobs.safe_files.UnsafeOutput": Exception,
    "capreward.jobs.settings_file.SettingsMismatch": Exception,
    "capreward.judges.loading.JudgeLoadError": OSError,
    "capreward.judges.remote.MalformedResponse": Exception,
    "capreward.media.backends.DecodeError": Exception,
    "capreward.media.backends.DecordMismatch": Exception,
    "capreward.media.errors.MediaError": ValueError,
    "capreward.media.errors.MediaRefused": ValueError,  # new: a MediaError whose file is refused
    "capreward.media.files.FileRefused": OSError,
    "capreward.media.probe.ProbeError": Exception,
    "capreward.metaeval.judgments.JudgmentError": ValueError,
    "capreward.report.rows.ReportInputError": ValueError,
    "capreward.testing.chat_server.BadRequest": ValueError,
    "capreward.training.relaxed.UnsupportedVocabularyError": ValueError,
    "capreward.registry.UnknownMetric": (ValueError, KeyError),
    "capreward.registry.UnknownOption": TypeError,  # new: a constructor option no metric takes
    "capreward.caption_budget.CaptionOverBudget": ValueError,  # a caption over the caption budget
    "capreward.hub.NotAModel": OSError,  # a local folder that holds no model
    "capreward.input_files.NotARegularFile": OSError,  # a FIFO, device or folder named as an input file
    "capreward.judges.remote.ResponseTooLarge": Exception,  # a judge answer past max_response_bytes
    "capreward.metrics.logprobs.MalformedAnswer": ValueError,  # non-finite or positive log-probabilities
    "capreward.scorers.contract.ContractError": TypeError,  # a scorer writing other sub-scores than its spec's
    "capreward.scorers.qa_questions.InvalidQuestions": ValueError,  # QA questions that fail the one check
    "capreward.testing.chat_server_native.BadRequest": ValueError,
}


def exception_classes() -> dict[str, type]:
    """Every exception class defined in a capreward module (found by importing each module), warnings
    aside (a warning is not an error)."""
    found = {}
    for info in pkgutil.walk_packages(capreward.__path__, "capreward."):
        with warnings.catch_warnings():  # a framework's own deprecation notices on import are not ours
            warnings.simplefilter("ignore", DeprecationWarning)
            module = importlib.import_module(info.name)
        for name, obj in vars(module).items():
            if (inspect.isclass(obj) and issubclass(obj, BaseException) and obj.__module__ == module.__name__
                    and not issubclass(obj, Warning) and obj is not CaprewardError):
                found[f"{module.__name__}.{name}"] = obj
    return found


def test_every_exception_class_derives_from_the_root_and_keeps_its_builtin_base():
    classes = exception_classes()
    assert set(classes) == set(BUILTIN_BASES), "a new exception class: add it to BUILTIN_BASES (and derive it from CaprewardError)"
    for name, cls in classes.items():
        assert issubclass(cls, CaprewardError), name
        assert issubclass(cls, BUILTIN_BASES[name]), name
    assert capreward.CaprewardError is CaprewardError


def test_an_error_is_caught_by_the_root_and_by_its_old_builtin_class():
    from capreward.hub import ModelNotAvailable
    from capreward.media import MediaError

    for exc, builtin in ((MediaError("image 'a.png'", "cannot be decoded"), ValueError),
                         (ModelNotAvailable("no model 'x' in the cache", "offline"), OSError)):
        for catch in (CaprewardError, builtin):
            with pytest.raises(catch):
                raise exc
    assert str(MediaError("image 'a.png'", "cannot be decoded")) == "image 'a.png': cannot be decoded"


def cli_context():
    from capreward.cli.main import build_parser

    parser = build_parser()
    return parser, parser.parse_args(["score", "m.jsonl", "--out", "o.jsonl"])


def test_the_cli_turns_every_capreward_error_into_its_message_and_anything_else_into_a_traceback():
    from capreward._extras import MissingExtraError
    from capreward.cli.common import CLIError
    from capreward.cli.main import user_error_message
    from capreward.jobs.errors import JobError
    from capreward.jobs.manifest import ManifestError
    from capreward.media import MediaError
    from capreward.metaeval.judgments import JudgmentError
    from capreward.report.rows import ReportInputError

    parser, args = cli_context()
    # the five caught by name before the root: their message as it is
    for exc in (CLIError("bad --metrics"), JobError("--out exists"), ManifestError("line 3: no caption"),
                JudgmentError("no judgments"), MissingExtraError("callbacks", "torchmetrics")):
        assert user_error_message(exc, parser, args) == str(exc)
    # any other capreward error is now a user error too, by its message
    for exc in (ReportInputError("results.jsonl line 2: not JSON"), MediaError("image 'a.png'", "cannot be decoded")):
        assert user_error_message(exc, parser, args) == str(exc)
    # not capreward's: a bug, re-raised by main
    for exc in (ValueError("bug"), RuntimeError("bug"), KeyError("k")):
        assert user_error_message(exc, parser, args) is None


def test_model_device_and_judge_errors_keep_their_flag_messages():
    from capreward.backbones.clip_loading import ModelLoadError
    from capreward.cli.main import user_error_message
    from capreward.devices import DeviceUnavailableError
    from capreward.judges.loading import JudgeLoadError

    parser, args = cli_context()
    assert user_error_message(DeviceUnavailableError("cuda:0: no GPU"), parser, args) == "--device: cuda:0: no GPU"
    model = ModelLoadError("no such file. If the weights ...", spec=args.clip_model)
    assert user_error_message(model, parser, args).startswith("--clip-model: no such file; ")
    judge = JudgeLoadError("not a LLaVA directory\nhint", spec=args.judge_model)
    assert user_error_message(judge, parser, args).startswith("--judge-model: not a LLaVA directory; ")


def test_main_prints_one_line_and_exits_2_for_a_capreward_error(monkeypatch, capsys):
    import capreward.cli.main as cli_main
    from capreward.report.rows import ReportInputError

    real = cli_main.build_parser

    def parser_with_failing_report():
        parser = real()
        report = parser._subparsers._group_actions[0].choices["report"]

        def fail(args):
            raise ReportInputError("results.jsonl line 2:\n  not JSON")

        report.set_defaults(func=fail)
        return parser

    monkeypatch.setattr(cli_main, "build_parser", parser_with_failing_report)
    assert cli_main.main(["report", "results.jsonl", "--out", "r.html"]) == 2
    assert capsys.readouterr().err == "capreward report: error: results.jsonl line 2: not JSON\n"
