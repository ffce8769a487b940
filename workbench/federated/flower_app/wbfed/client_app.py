"""ClientApp: a site trains the global LoRA adapter on its own rows and evaluates it there.

The data path is the SuperNode's `--node-config 'data-path="/site/folder"'`; replies carry
adapter tensors, allow-listed numbers and the site's name only."""

from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from workbench.federated.client import handle_evaluate, handle_train
from workbench.federated.knowledge.client import handle_knowledge

app = ClientApp()


@app.train()
def train(msg: Message, context: Context) -> Message:
    return handle_train(msg, context)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    return handle_evaluate(msg, context)


@app.query("knowledge")
def knowledge(msg: Message, context: Context) -> Message:
    return handle_knowledge(msg, context)
