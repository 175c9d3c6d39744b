"""The preprocessing scripts on small copies of each source in its published format (tests/fixtures)."""

import importlib.util
import json
import subprocess
import sys
import types
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dagrl.data import read_rows

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "examples" / "data_preprocess"
FIXTURES = REPO / "tests" / "fixtures"


def load_script(name):
    spec = importlib.util.spec_from_file_location(f"preprocess_{name}", SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gsm8k = load_script("gsm8k")
math_dataset = load_script("math_dataset")
deepscaler = load_script("deepscaler")
common = sys.modules["common"]


def gsm8k_parquet(root: Path) -> Path:
    """GSM8K parquet as examples/data_preprocess/gsm8k.py writes it, from the fixture rows repeated
    to fill a 64-prompt batch (4 of 9 rows are valid): ROOT/gsm8k/{train,test}.parquet."""
    import shutil

    source = root / "gsm8k_src"
    source.mkdir()
    rows = (FIXTURES / "gsm8k" / "train.jsonl").read_text().splitlines()
    (source / "train.jsonl").write_text("\n".join(rows * 20) + "\n")
    shutil.copy(FIXTURES / "gsm8k" / "test.jsonl", source / "test.jsonl")
    assert gsm8k.main(["--local_dir", str(root / "gsm8k"), "--local_src", str(source)]) == 0
    return root / "gsm8k"


def run(script, tmp_path, *args):
    """Run a script's main; return (exit status, {split: rows read back})."""
    out = tmp_path / "out"
    status = script.main(["--local_dir", str(out), *map(str, args)])
    rows = {p.stem: read_rows([str(p)]) for p in sorted(out.glob("*.parquet"))}
    return status, rows


def skipped_rows(summary):
    """{reason: source rows} from a script's summary, over all splits."""
    skipped = {}
    for line in summary.splitlines():
        if " row(s): " in line:
            reason, rows = line.strip().rsplit(" row(s): ", 1)
            reason = reason.rsplit(": ", 1)[0]
            skipped.setdefault(reason, []).extend(int(i) for i in rows.split(", "))
    return {reason: sorted(rows) for reason, rows in skipped.items()}


def answers(rows):
    return [row["reward_model"]["ground_truth"] for row in rows]


# ---------------------------------------------------------------------------------------------- gsm8k


def test_gsm8k_answer_extraction():
    assert gsm8k.extract_answer("48+24 = 72\n#### 72") == "72"
    assert gsm8k.extract_answer("so 1,500\n#### 1,500") == "1500"
    with pytest.raises(common.RowError, match="no '####'"):
        gsm8k.extract_answer("the answer is 5")


def test_gsm8k_skips_bad_rows_and_reports_them(tmp_path, capsys):
    status, rows = run(gsm8k, tmp_path, "--local_src", FIXTURES / "gsm8k")
    assert status == 0
    assert answers(rows["train"]) == ["72", "10", "1500", "624"]
    assert answers(rows["test"]) == ["18", "3", "-3"]
    first = rows["train"][0]
    assert first["data_source"] == "openai/gsm8k" and first["ability"] == "math"
    assert first["prompt"][0]["content"].endswith(
        "How many clips did Natalia sell altogether in April and May? Let's think step by step and output "
        'the final answer after "####".'
    )
    assert first["extra_info"]["split"] == "train" and first["extra_info"]["index"] == 0
    assert first["extra_info"]["answer"].endswith("#### 72")
    assert rows["train"][3]["extra_info"]["index"] == 8  # the source row number, not the output position
    assert first.get("teacher_prompt") is None
    summary = capsys.readouterr().out
    assert "train: 9 rows in, 4 rows out, 5 skipped" in summary
    assert "test: 3 rows in, 3 rows out, 0 skipped" in summary
    assert "missing column 'answer': 1 row(s): 3" in summary
    assert "no '####' final answer in 'answer': 1 row(s): 4" in summary
    assert "nothing after '####' in 'answer': 1 row(s): 5" in summary
    assert "empty 'question': 1 row(s): 6" in summary
    assert "not a JSON object: 1 row(s): 7" in summary
    assert "wrote " in summary


def test_gsm8k_fail_mode_writes_nothing_and_names_the_row(tmp_path, capsys):
    status, rows = run(gsm8k, tmp_path, "--local_src", FIXTURES / "gsm8k", "--on_error", "fail")
    assert status == 1 and rows == {}
    captured = capsys.readouterr()
    assert "train: 9 rows in, 4 rows out, 5 skipped" in captured.out  # the report still comes first
    assert "gsm8k train row 3: missing column 'answer' (5 bad rows in all" in captured.err
    assert "--on_error skip" in captured.err


def test_gsm8k_max_rows_and_custom_instruction(tmp_path, capsys):
    status, rows = run(
        gsm8k,
        tmp_path,
        "--local_src",
        FIXTURES / "gsm8k",
        "--max_rows",
        2,
        "--instruction",
        "Q: {question} A:",
    )
    assert status == 0 and len(rows["train"]) == 2 and len(rows["test"]) == 2
    assert rows["test"][1]["prompt"][0]["content"].startswith("Q: A robe takes")
    assert rows["test"][1]["prompt"][0]["content"].endswith("How many bolts in total does it take? A:")
    assert "train: 2 rows in, 2 rows out, 0 skipped" in capsys.readouterr().out


def test_gsm8k_teacher_prompt(tmp_path):
    template = "{question}\nReference solution:\n{solution}\nNow solve it yourself."
    status, rows = run(
        gsm8k, tmp_path, "--local_src", FIXTURES / "gsm8k", "--teacher_prompt_template", template
    )
    assert status == 0
    teacher = rows["train"][0]["teacher_prompt"]
    assert teacher[0]["role"] == "user"
    assert teacher[0]["content"].startswith("Natalia sold clips")
    assert "Natalia sold 48/2 = 24 clips in May." in teacher[0]["content"]  # calculator notes removed
    assert teacher[0]["content"].endswith("#### 72\nNow solve it yourself.")


def test_teacher_template_needs_both_fields(tmp_path):
    with pytest.raises(SystemExit):
        gsm8k.main(["--local_dir", str(tmp_path), "--teacher_prompt_template", "{question} only"])


def test_gsm8k_from_hub_parquet_layout(tmp_path):
    # the hub repo holds main/train-00000-of-00001.parquet and socratic/...; point at main/
    main_dir = tmp_path / "gsm8k" / "main"
    main_dir.mkdir(parents=True)
    (tmp_path / "gsm8k" / "socratic").mkdir()
    for split in ("train", "test"):
        records = [r for r in map(common._parse_line, (FIXTURES / "gsm8k" / f"{split}.jsonl").open()) if r]
        records = [{"question": r.get("question"), "answer": r.get("answer")} for r in records]
        pq.write_table(pa.Table.from_pylist(records), main_dir / f"{split}-00000-of-00001.parquet")
    status, rows = run(gsm8k, tmp_path, "--local_src", main_dir)
    assert status == 0 and answers(rows["train"]) == ["72", "10", "1500", "624"]
    with pytest.raises(common.DataError, match=r"holds no .* files .*subdirs \['main', 'socratic'\]"):
        common.load_local(str(tmp_path / "gsm8k"), ("train", "test"))


def test_local_src_without_a_split_file(tmp_path, capsys):
    only_train = tmp_path / "src"
    only_train.mkdir()
    (only_train / "train.jsonl").write_text((FIXTURES / "gsm8k" / "train.jsonl").read_text())
    (only_train / "train_socratic.jsonl").write_text("{}\n")  # not a split file: ignored
    status, _ = run(gsm8k, tmp_path, "--local_src", only_train)
    assert status == 1
    assert (
        "no file for split(s) ['test'] among ['train.jsonl', 'train_socratic.jsonl']"
        in capsys.readouterr().err
    )


def test_script_runs_from_its_directory(tmp_path):
    out = tmp_path / "gsm8k"
    result = subprocess.run(
        [sys.executable, "gsm8k.py", "--local_dir", str(out), "--local_src", str(FIXTURES / "gsm8k")],
        cwd=SCRIPTS,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "train: 9 rows in, 4 rows out, 5 skipped" in result.stdout
    assert len(read_rows([str(out / "train.parquet")])) == 4


# ---------------------------------------------------------------------------------------------- math


def test_math_answers_and_report(tmp_path, capsys):
    status, rows = run(math_dataset, tmp_path, "--local_src", FIXTURES / "math")
    assert status == 0
    assert answers(rows["train"]) == ["\\frac{3}{4}", "4", "\\{-1, 1\\}", "2^{\\frac{2}{2}}"]
    assert answers(rows["test"]) == ["2", "17"]
    first = rows["train"][0]
    assert first["data_source"] == "DigitalLearningGmbH/MATH-lighteval"
    assert first["extra_info"]["level"] == "Level 1" and first["extra_info"]["type"] == "Prealgebra"
    assert first["prompt"][0]["content"].endswith(
        "Let's think step by step and output the final answer within \\boxed{}."
    )
    summary = capsys.readouterr().out
    assert "train: 9 rows in, 4 rows out, 5 skipped" in summary
    assert "no complete \\boxed{...} answer in 'solution': 2 row(s): 4, 8" in summary
    assert "missing column 'solution': 1 row(s): 5" in summary
    assert "empty \\boxed{} in 'solution': 1 row(s): 6" in summary
    assert "empty 'problem': 1 row(s): 7" in summary


def test_math_teacher_prompt_keeps_latex_braces(tmp_path):
    template = "Problem: {question}\nSolution: {solution}\nSolve it within \\boxed{}."
    status, rows = run(
        math_dataset, tmp_path, "--local_src", FIXTURES / "math", "--teacher_prompt_template", template
    )
    assert status == 0
    content = rows["train"][0]["teacher_prompt"][0]["content"]
    assert content.startswith(
        "Problem: What is the value of $\\frac{1}{2} + \\frac{1}{4}$?\nSolution: We have"
    )
    assert content.endswith("\\boxed{\\frac{3}{4}}$.\nSolve it within \\boxed{}.")


# ---------------------------------------------------------------------------------------------- deepscaler


def test_deepscaler_holdout_and_answers(tmp_path, capsys):
    args = ("--local_src", FIXTURES / "deepscaler" / "deepscaler.json", "--test_size", 3, "--seed", 2)
    status, rows = run(deepscaler, tmp_path, *args)
    assert status == 0
    train_idx = [r["extra_info"]["index"] for r in rows["train"]]
    test_idx = [r["extra_info"]["index"] for r in rows["test"]]
    assert not set(train_idx) & set(test_idx)
    assert train_idx == sorted(train_idx) and test_idx == sorted(test_idx)
    by_index = {r["extra_info"]["index"]: r for r in rows["train"] + rows["test"]}
    assert sorted(by_index) == [0, 1, 2, 3, 8, 9]  # the good rows, split between train and test
    assert [by_index[i]["reward_model"]["ground_truth"] for i in (0, 2, 3)] == ["5", "\\frac{1}{2}", "8"]
    assert all(r["extra_info"]["split"] == split for split in rows for r in rows[split])
    summary = capsys.readouterr().out
    assert "train: 7 rows in" in summary and "test: 3 rows in" in summary
    # the same seed gives the same split
    status, again = run(deepscaler, tmp_path / "again", *args)
    assert [r["extra_info"]["index"] for r in again["test"]] == test_idx


def test_deepscaler_bad_rows_and_teacher_prompt(tmp_path, capsys):
    template = "{question}\nReference: {solution}"
    status, rows = run(
        deepscaler,
        tmp_path,
        *("--local_src", FIXTURES / "deepscaler", "--test_size", 1, "--teacher_prompt_template", template),
    )
    assert status == 0
    by_index = {r["extra_info"]["index"]: r for r in rows["train"] + rows["test"]}
    assert by_index[2].get("teacher_prompt") is None  # no reference solution: stays plain
    assert by_index[0]["teacher_prompt"][0]["content"].startswith("Let $a$ and $b$")
    assert skipped_rows(capsys.readouterr().out) == {
        "missing column 'answer'": [4],
        "empty 'answer'": [5],
        "missing column 'problem'": [6],
        "not a JSON object": [7],
    }


def test_deepscaler_test_size_too_large(tmp_path, capsys):
    status, _ = run(deepscaler, tmp_path, "--local_src", FIXTURES / "deepscaler", "--test_size", 10)
    assert status == 1
    assert "--test_size 10 must be between 1 and 9" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------- hub path


def test_missing_datasets_package_suggests_local_src(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "datasets", None)  # makes `import datasets` fail
    status, _ = run(gsm8k, tmp_path)
    assert status == 1
    err = capsys.readouterr().err
    assert "needs the 'datasets' package" in err and "--local_src PATH" in err


def test_unreachable_hub_suggests_local_src(tmp_path, monkeypatch, capsys):
    def load_dataset(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'openai/gsm8k' on the Hub")

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    status, _ = run(gsm8k, tmp_path)
    assert status == 1
    err = capsys.readouterr().err
    assert "could not load openai/gsm8k from the Hugging Face hub (ConnectionError" in err
    assert "--local_src PATH" in err


def test_hub_path_uses_datasets_map(tmp_path, monkeypatch, capsys):
    import datasets  # the test extra brings it: a missing one fails here rather than skipping

    raw = json.loads((FIXTURES / "deepscaler" / "deepscaler.json").read_text())
    good = [r for r in raw if isinstance(r, dict) and "problem" in r and "answer" in r]
    good = [{"problem": r["problem"], "answer": str(r["answer"]), "solution": r["solution"]} for r in good]
    calls = []

    def load_dataset(name, *args, **kwargs):
        calls.append((name, args))
        return datasets.DatasetDict({"train": datasets.Dataset.from_list(good)})

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    args = ("--test_size", 2, "--num_proc", 2, "--teacher_prompt_template", "{question}|{solution}")
    status, rows = run(deepscaler, tmp_path, *args)
    assert status == 0 and calls == [("agentica-org/DeepScaleR-Preview-Dataset", ())]
    assert len(rows["train"]) + len(rows["test"]) == 6
    assert "empty 'answer': 1 row(s): 4" in capsys.readouterr().out
    assert sorted(r["extra_info"]["index"] for r in rows["train"] + rows["test"]) == [0, 1, 2, 3, 5, 6]
    plain = [r for r in rows["train"] + rows["test"] if r.get("teacher_prompt") is None]
    assert [r["extra_info"]["question"] for r in plain] == ["What is $\\frac{1}{3}+\\frac{1}{6}$?"]


# ---------------------------------------------------------------------------------------------- builtin


def test_builtin_arith_export(tmp_path, capsys):
    builtin_arith = load_script("builtin_arith")
    status = builtin_arith.main(["--local_dir", str(tmp_path), "--train_size", "20", "--test_size", "5"])
    assert status == 0
    train, test = read_rows([str(tmp_path / "train.parquet")]), read_rows([str(tmp_path / "test.parquet")])
    assert len(train) == 20 and len(test) == 5
    assert {r["extra_info"]["question"] for r in train}.isdisjoint(r["extra_info"]["question"] for r in test)
    assert "train: 20 rows in, 20 rows out, 0 skipped" in capsys.readouterr().out


def test_problem_placeholder_and_response_column_load_for_distillation(tmp_path):
    """--teacher_prompt_template with {problem}, --write_response: a parquet the OPSD and
    off-policy GKD runs read (teacher_prompt ids and reference responses)."""
    from transformers import AutoTokenizer

    from dagrl.data import PromptDataset
    from dagrl.data.builtin import tiny_model_path

    template = "{problem}\nReference solution: {solution}\n"
    status, rows = run(
        gsm8k,
        tmp_path,
        "--local_src",
        FIXTURES / "gsm8k",
        "--teacher_prompt_template",
        template,
        "--write_response",
    )
    assert status == 0
    row = rows["train"][0]
    assert row["teacher_prompt"][0]["content"].startswith("Natalia sold clips")
    assert "\nReference solution: Natalia sold 48/2 = 24 clips in May." in row["teacher_prompt"][0]["content"]
    assert row["response"].endswith("#### 72")
    tok = AutoTokenizer.from_pretrained(tiny_model_path())
    data = PromptDataset(str(tmp_path / "out" / "train.parquet"), tok, max_prompt_length=4096)
    assert data.has_responses
    # the teacher reads the filled template, not the student's prompt
    teacher_text = tok.decode(data[0].teacher_prompt_ids)
    assert "Natalia sold clips" in teacher_text
    assert "\nReference solution: Natalia sold 48/2 = 24 clips in May." in teacher_text
    assert data[0].response_ids[-1] == tok.eos_token_id


# ---------------------------------------------------------------------------------------------- empty splits


def test_an_empty_split_writes_nothing_and_says_so(tmp_path, capsys):
    """A test split with no rows: train.parquet is written, no empty test.parquet, the script
    succeeds and its summary says why test.parquet is missing; a test.parquet an earlier run left
    there is removed rather than kept beside the new train split."""
    source = tmp_path / "src"
    source.mkdir()
    (source / "train.jsonl").write_text((FIXTURES / "gsm8k" / "train.jsonl").read_text())
    (source / "test.jsonl").write_text("")
    out = tmp_path / "out"
    out.mkdir()
    pq.write_table(pa.table({"stale": [1]}), out / "test.parquet")

    status, rows = run(gsm8k, tmp_path, "--local_src", source)
    summary = capsys.readouterr().out
    assert status == 0, summary
    assert list(rows) == ["train"] and len(rows["train"]) > 0
    assert f"test: no rows, {out / 'test.parquet'} not written" in summary
    assert "earlier run" in summary and "test: 0 rows in, 0 rows out" in summary


def test_a_split_whose_rows_are_all_skipped_is_not_written(tmp_path, capsys):
    source = tmp_path / "src"
    source.mkdir()
    (source / "train.jsonl").write_text((FIXTURES / "gsm8k" / "train.jsonl").read_text())
    (source / "test.jsonl").write_text(json.dumps({"question": "q", "answer": "no final answer"}) + "\n")
    status, rows = run(gsm8k, tmp_path, "--local_src", source)
    assert status == 0 and list(rows) == ["train"]
    assert "test: 1 rows in, 0 rows out, 1 skipped" in capsys.readouterr().out


def test_no_rows_in_any_split_is_an_error_and_writes_nothing(tmp_path, capsys):
    source = tmp_path / "src"
    source.mkdir()
    for split in ("train", "test"):
        (source / f"{split}.jsonl").write_text("")
    status, rows = run(gsm8k, tmp_path, "--local_src", source)
    captured = capsys.readouterr()
    assert status == 1 and rows == {}
    assert "no rows in any split (train, test); nothing written" in captured.err


def test_builtin_arith_without_a_test_split(tmp_path, capsys):
    builtin_arith = load_script("builtin_arith")
    status = builtin_arith.main(["--local_dir", str(tmp_path), "--train_size", "8", "--test_size", "0"])
    assert status == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.parquet"]
    assert "test: no rows" in capsys.readouterr().out
