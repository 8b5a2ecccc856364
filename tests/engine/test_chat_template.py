"""A chat template that refuses the messages (as many real ones do, e.g. for roles out of order) gets a 400 naming
`messages`, never a 500: a real Hugging Face tokenizer folder whose template raises, behind a live server."""
import httpx
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from engine.engine import Engine
from engine.model.tokenizer import HFTokenizer
from engine.server.api import create_app
from engine.server.local_server import serving_in_thread
from engine.server.service import EngineService
from seam import EngineConfig

TEMPLATE = ("{% for m in messages %}{% if m['role'] == 'system' and not loop.first %}"
            "{{ raise_exception('a system message may only come first') }}{% endif %}{{ m['content'] }}{% endfor %}")


def _tokenizer_folder(folder):
    words = Tokenizer(models.WordLevel({"<unk>": 0, "hi": 1, "there": 2}, unk_token="<unk>"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=words, unk_token="<unk>", eos_token="<unk>",
                            chat_template=TEMPLATE).save_pretrained(folder)
    return folder


def test_a_chat_template_error_is_a_400_naming_messages(moe_models, tmp_path):
    tokenizer = HFTokenizer(_tokenizer_folder(tmp_path / "tokenizer"))
    engine = Engine(moe_models.target, tokenizer, config=EngineConfig(spec_method="off", draft_len=0))
    service = EngineService(engine)
    with serving_in_thread(create_app(service, "tiny", None), service) as url:
        reply = httpx.post(f"{url}/v1/chat/completions", json={"model": "tiny", "max_tokens": 2, "messages": [
            {"role": "user", "content": "hi"}, {"role": "system", "content": "there"}]})
        accepted = httpx.post(f"{url}/v1/chat/completions", json={"model": "tiny", "max_tokens": 2, "messages": [
            {"role": "system", "content": "hi"}, {"role": "user", "content": "there"}]})
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == "messages" and "system message may only come first" in error["message"]
    assert accepted.status_code == 200, accepted.text
