"""A recipe, its configs and its tuned table living in another installed package (a shared recipe repo), used
from mmt's train.py through Hydra's search path: ``hydra.searchpath=[pkg://mmt_shared_recipes.conf]``."""

from helpers.app import job_dirs, results, run_app
from helpers.recipes import SHARED_SEARCHPATH


def test_a_recipe_from_an_installed_package_trains_on_two_by_two(shared_recipes, tmp_path, tag):
    done = run_app(
        SHARED_SEARCHPATH,
        "recipe=tiny",
        "num_nodes=2",
        "devices=2",
        sweep_dir=tmp_path,
        tag=tag,
        PYTHONPATH=str(shared_recipes),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    [result] = results(tmp_path)
    value = result["return_value"]
    assert value["recipe_file"].startswith(str(shared_recipes)), "the code came from the installed package"
    assert value["world_size"] == 4 and value["weights_in_sync"]
    assert value["val_loss"] < value["val_loss_first"] / 10
    # global 48 over 4 ranks = 12 per rank; the package's own table limits it to 5 per device: 4 x 3
    assert (value["micro_batch_size"], value["grad_accum"]) == (4, 3)
    [job] = job_dirs(tmp_path)
    assert "_target_: mmt_shared_recipes.tiny.train" in (job / ".hydra" / "config.yaml").read_text()


def test_its_dry_run_names_the_packages_tuned_table(shared_recipes, tmp_path):
    done = run_app(
        SHARED_SEARCHPATH,
        "recipe=tiny",
        "num_nodes=2",
        "devices=2",
        "hydra.launcher.dry_run=true",
        sweep_dir=tmp_path,
        PYTHONPATH=str(shared_recipes),
    )
    assert done.returncode == 0, done.stderr
    assert (
        "batch      global 48 = 4 ranks x micro 4 x accumulate 3; limit 5 per device (tuned for tiny/cpu/32-true "
        "with 4 GiB per device, tuned 2026-01-01T00:00:00Z, torch 2.13.0+cpu, lightning 2.6.6, 1000 samples/s; "
        "pkg://mmt_shared_recipes.tuned/tiny.yaml)"
    ) in done.stdout


def test_without_the_search_path_the_recipe_is_unknown(shared_recipes, tmp_path):
    done = run_app("recipe=tiny", "hydra.launcher.dry_run=true", sweep_dir=tmp_path, PYTHONPATH=str(shared_recipes))
    assert done.returncode != 0 and "Could not find 'recipe/tiny'" in done.stderr
    assert "\tlm_fabric\n" in done.stderr  # Hydra lists the recipes it does know
