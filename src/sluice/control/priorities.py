"""Priority classes as admins manage them, and how a submitted spec gets its priority from one
(docs/queues.md).

A job's priority is resolved once, at submit, and written into its spec (`priority` = the
class's value, `priority_class` = its name), as Kubernetes' priority admission plugin and
Kueue do: admission, placement and every policy keep reading one integer, and deleting a class
is refused while a job still uses it, so a job's class can always be looked up.
"""

from __future__ import annotations

import time

from sluice.control.controller import Controller
from sluice.control.errors import Conflict, NotFound, some
from sluice.model.queue import PriorityClass
from sluice.spec import JobSpec, PriorityClassSpec, SpecError
from sluice.spec.errors import FieldProblem
from sluice.store import Store


def class_of(spec: PriorityClassSpec) -> PriorityClass:
    return PriorityClass(
        name=spec.name,
        value=spec.value,
        description=spec.description,
        preempts=spec.preemption == "allowed",
        default=spec.default,
        created_at=time.time(),
    )


class PriorityClassService:
    def __init__(self, store: Store, controller: Controller) -> None:
        self.store = store
        self.controller = controller

    def create(self, spec: PriorityClassSpec) -> PriorityClass:
        """A new class; a second default is refused (which one would a job get?)."""
        if self.store.get_priority_class(spec.name) is not None:
            raise Conflict(f"priority class {spec.name!r} already exists; delete it first to change it")
        if spec.default:
            other = next((p for p in self.store.list_priority_classes() if p.default), None)
            if other is not None:
                raise Conflict(
                    f"priority class {other.name!r} is already the default, and only one class can be: "
                    f"create {spec.name!r} without making it the default, or delete {other.name!r} first"
                )
        pc = class_of(spec)
        self.store.save_priority_class(pc)
        return pc

    def list(self) -> list[PriorityClass]:
        return self.store.list_priority_classes()

    def delete(self, name: str) -> None:
        """Refused while a job that has not finished uses it: its `job get` names the class."""
        if self.store.get_priority_class(name) is None:
            raise NotFound(f"priority class {name!r} not found")
        # Checked and deleted under the controller's lock, in which a submit makes its job
        # after checking its class is still there (`ControlPlane._may_still_create`).
        with self.controller.lock:
            live = [j.id for j in self.controller.book.live() if j.spec.priority_class == name]
            if live:
                raise Conflict(f"priority class {name!r} is used by {len(live)} unfinished job(s): {some(live)}")
            self.store.delete_priority_class(name)

    def check_exists(self, spec: JobSpec) -> None:
        """A 422 naming `priority_class` if the spec's class is gone (deleted while the submit
        was on its way): a job's class always exists while the job is unfinished."""
        name = spec.priority_class
        if name is not None and self.store.get_priority_class(name) is None:
            # It existed when the spec was read (or was the default class filled in then): an
            # admin deleted it since. Said so, as the field may be one the user never set.
            raise SpecError(
                [
                    FieldProblem(
                        "priority_class",
                        f"priority class {name!r} (given, or the default class) was deleted while this job was "
                        "being submitted; submit again",
                    )
                ]
            )

    def resolve(self, spec: JobSpec) -> JobSpec:
        """The spec with its priority taken from its class (or the default class when it sets
        neither `priority` nor `priority_class`). A `priority` that differs from the named
        class's value is refused, as Kubernetes refuses a pod whose priority contradicts its
        class; the same value is accepted, so a resolved spec can be submitted again."""
        name = spec.priority_class
        if name is None:
            if "priority" in spec.model_fields_set:
                return spec  # a bare integer, as before classes existed
            pc = next((p for p in self.store.list_priority_classes() if p.default), None)
            if pc is None:
                return spec
        else:
            found = self.store.get_priority_class(name)
            if found is None:
                raise SpecError([FieldProblem("priority_class", f"no priority class named {name!r}; ask an admin")])
            pc = found
            if "priority" in spec.model_fields_set and spec.priority != pc.value:
                raise SpecError(
                    [
                        FieldProblem(
                            "priority",
                            f"{spec.priority} contradicts priority_class {name!r} (value {pc.value}); "
                            "set one of them, not both",
                        )
                    ]
                )
        return spec.model_copy(update={"priority": pc.value, "priority_class": pc.name})

    @staticmethod
    def check_cap(tenant: str, cap: int | None, asked: JobSpec, resolved: JobSpec) -> None:
        """A 422 unless the resolved priority is within the tenant's `max_priority` (`cap`,
        None: no cap). `asked` is the spec as submitted, `resolved` the one `resolve` made of
        it: the problem names the field that gave the priority (the class's, the bare
        integer, or the default class a job that set neither got)."""
        if cap is None or resolved.priority <= cap:
            return
        limit = f"above the max_priority {cap} of tenant {tenant!r}"
        fix = f"use {cap} or lower, or ask an admin to raise the cap"
        if asked.priority_class is not None:
            problem = FieldProblem(
                "priority_class",
                f"class {resolved.priority_class!r} has priority {resolved.priority}, {limit}; "
                f"use a class whose value is {cap} or lower, or ask an admin to raise the cap",
            )
        elif "priority" in asked.model_fields_set:
            problem = FieldProblem("priority", f"{resolved.priority} is {limit}; {fix}")
        elif resolved.priority_class is not None:
            problem = FieldProblem(
                "priority_class",
                f"not set, so the default class {resolved.priority_class!r} applies with priority "
                f"{resolved.priority}, {limit}; set priority or priority_class to {cap} or lower",
            )
        else:
            problem = FieldProblem("priority", f"not set, so {resolved.priority}, which is {limit}; {fix}")
        raise SpecError([problem])


__all__ = ["PriorityClassService", "class_of"]
