"""wbfed: the Flower client and server apps of the Domain-Agent Workbench."""
