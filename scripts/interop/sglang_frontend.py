"""SGLang's own frontend (`import sglang as sgl`) against `lmprog serve`'s native API, on
loopback: a chat turn, `select`, a regex gen, `fork`/`join` and `run_batch`, each printed OK
or FAIL with the error.

SGLang is not a dependency of lmprog; its frontend imports without its server stack:

    pip download sglang --no-deps -d /tmp/sglw
    pip install --no-deps --target /tmp/sglsite /tmp/sglw/*.whl orjson psutil pybase64 \
        pillow msgspec pyzmq ipython traitlets aiohttp multidict yarl propcache \
        aiohappyeyeballs aiosignal frozenlist
    PYTHONPATH=/tmp/sglsite .venv/bin/python scripts/interop/sglang_frontend.py
"""

import sglang as sgl

import lmprog as lp
from lmprog.serve import Server

rt = lp.Runtime(device="cpu", max_total_tokens=8192)
with Server(rt).start() as srv:
    sgl.set_default_backend(sgl.RuntimeEndpoint(srv.url))

    @sgl.function
    def qa(s, question):
        s += sgl.system("You are a helpful assistant.")
        s += sgl.user(question)
        s += sgl.assistant(sgl.gen("answer", max_tokens=16, temperature=0))

    @sgl.function
    def pick(s):
        s += "The sky is " + sgl.select("color", choices=["blue", "green", "red"])

    @sgl.function
    def typed(s):
        s += "Q: How many legs does a cat have? A: " + sgl.gen("n", regex=r"[0-9]+", max_tokens=4)

    @sgl.function
    def forked(s):
        s += "List two fruits:\n"
        f = s.fork(2)
        for i, x in enumerate(f):
            x += f"{i + 1}." + sgl.gen("item", max_tokens=6, stop="\n", temperature=0)
        f.join()

    results = {}
    for name, fn, kw in [
        ("qa", qa, {"question": "What is the capital of France?"}),
        ("select", pick, {}),
        ("regex", typed, {}),
        ("fork", forked, {}),
    ]:
        try:
            st = fn.run(**kw)
            results[name] = "OK " + repr(st.text()[-60:])
        except Exception as e:  # noqa: BLE001 - reported, the next program runs
            results[name] = f"FAIL {type(e).__name__}: {str(e)[:300]}"
    st = qa.run_batch([{"question": "Say hi."}, {"question": "Say bye."}])
    results["batch"] = "OK " + repr([x["answer"][:20] for x in st])
    for k, v in results.items():
        print(k, v)
rt.shutdown()
