"""The graph's lifecycle as explicit state objects: building -> validated -> planned ->
built. Each state answers the two questions every public path asks — may the graph
change, and what a change invalidates — so no flag is scattered over the graph class."""

from .._types import GraphStateError


class State:
    name = "?"
    mutable = True
    validated = False
    planned = False

    def require_mutable(self, what):
        if not self.mutable:
            raise GraphStateError(
                f"{what}: the graph is frozen ({self.name}); build a new graph to change it"
            )

    def on_mutation(self, graph):
        """A write landed while this state held."""


class Building(State):
    name = "building"


class ValidatedOpen(State):
    """Validated natively and still mutable: python-only graphs and graphs a family
    validator accepted. A mutation drops the validation and the cached candidates."""

    name = "validated (open)"
    validated = True

    def on_mutation(self, graph):
        graph._state = Building()
        graph._candidates = None


class Frozen(State):
    mutable = False
    validated = True


class ValidatedFrozen(Frozen):
    """Validated by lowering (classic error timing): the surface is sealed."""

    name = "validated (lowered, frozen)"


class Planned(Frozen):
    name = "planned"
    planned = True


class Built(Frozen):
    name = "built"
    planned = True
