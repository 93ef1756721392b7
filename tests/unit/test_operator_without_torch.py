"""The operator image has no torch: the API models, handlers and CRD generator must import without it."""
import subprocess
import sys


def test_operator_and_config_models_do_not_import_torch():
    code = ("import sys; import ascend_operator.kinds, ascend_operator.main, ascend_operator.api.crdgen, "
            "ascend_engine.config.train, ascend_engine.config.prep, ascend_engine.config.convert; "
            "heavy = [m for m in ('torch', 'megatron', 'transformers') if m in sys.modules]; print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
