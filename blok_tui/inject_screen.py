"""The inject modal: pick a queue, write a JSON payload, set priority and delay. Nothing is
sent until everything is valid; what is wrong is said right here, in the modal. The payload
starts as the queue's template: the `$.body` fields its workflow reads, each null to fill in
(the first one selected, so typing replaces it); picking another queue swaps the template in
while the payload is untouched.

The same editor serves edit-and-replay: the run's input opens in it, and sending replays the
run with the edited input (its queue is the run's, so there is no queue, priority or delay);
and sending an event to a run (`event_for`): an event name and its JSON payload, which the
run's `wait.for_event` takes as its output."""

from __future__ import annotations

import json
from typing import Any, ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Select, Static, TextArea
from textual.widgets.text_area import Selection

from engine import EngineError, EventSent, Run, WorkflowInfo, parse_duration
from engine.api import EngineAPI

from .payload_template import missing_fields, null_fields, template_text
from .plain_text import typed_duration

TINY = 24  # lines under which the modal's fields and buttons go without borders


def check_payload(source: str) -> tuple[Any, str | None]:
    """The payload, or why it is not JSON (with line and column)."""
    if not source.strip():
        return None, 'the payload is empty: write a JSON value, e.g. {} or {"order_id": "A1"}'
    try:
        return json.loads(source), None
    except json.JSONDecodeError as error:
        return None, f"not valid JSON: line {error.lineno}, column {error.colno}: {error.msg}"


class InjectScreen(ModalScreen[str | None]):
    """Dismissed with the new job's id (the new run's id for a replay, the run's id for an
    event), or None when the operator backs out."""

    BINDINGS: ClassVar[list[BindingType]] = [
        # priority: the payload editor would take the first escape for itself (to leave it).
        Binding("escape", "close", "close", priority=True),
        Binding("ctrl+s", "send", "send", priority=True),
    ]

    def __init__(
        self,
        engine: EngineAPI,
        queues: list[str],
        queue: str | None = None,
        *,
        replay_of: Run | None = None,
        event_for: Run | None = None,
        event: str = "",
        workflows: dict[str, WorkflowInfo] | None = None,
        note: str = "",
    ) -> None:
        """`workflows`: queue → the workflow its jobs run, for the payload's template; `note`:
        said under the question (when an event's wait gives up)."""
        super().__init__()
        self.note = note
        self.engine = engine
        self.workflows = workflows or {}
        self.template = ""  # the template in the editor, while the operator has not edited it
        self.replay_of = replay_of
        self.event_for = event_for
        self.sent: EventSent | None = None  # what became of the event sent (event_for)
        self.event = event
        if event_for is not None:
            replay_of = None
            queue = event_for.queue
        if replay_of is not None:
            queue = replay_of.queue
            queues = list(dict.fromkeys([*queues, queue]))
        self.queues = queues
        self.initial = queue

    def compose(self) -> ComposeResult:
        known = self.initial in self.queues
        source = self.replay_of
        target = self.event_for
        with Vertical(id="dialog", classes="dialog inject"):
            if target is not None:
                yield Static(
                    Text.assemble(
                        "Send an event to ",
                        (target.id, "bold"),
                        (f"  {target.workflow_name}, {target.status}", "dim"),
                        (f"\n{self.note}" if self.note else "", "khaki3"),
                    ),
                    classes="question",
                )
            elif source is None:
                yield Static("Inject a job", classes="question")
            else:
                yield Static(
                    Text.assemble(
                        "Edit and replay ",
                        (source.id, "bold"),
                        (f"  {source.workflow_name}, {source.status}", "dim"),
                    ),
                    classes="question",
                )
            with Horizontal(classes="field", id="event-field"):
                yield Label("event", classes="label")
                name = Input(self.event, id="event", placeholder="the event's name: approved")
                name.cursor_blink = False
                yield name
            with Horizontal(classes="field", id="queue-field"):
                yield Label("queue", classes="label")
                yield Select(
                    [(q, q) for q in self.queues],
                    value=self.initial if known else Select.NULL,
                    prompt="pick a queue",
                    id="queue",
                    disabled=source is not None,
                )
            yield Label(
                "payload (JSON): the wait's output"
                if target is not None
                else self.template_label(self.initial)
                if source is None
                else "input (JSON): the new run gets this",
                classes="label wide",
                id="payload-label",
            )
            text = "{}"
            if source is not None and target is None:
                text = json.dumps(source.input, indent=2, ensure_ascii=False, default=str)
            elif target is None:
                text = self.template = self.template_for(self.initial)
            area = TextArea(text, id="payload", show_line_numbers=True, tab_behavior="focus")
            area.cursor_blink = False
            yield area
            with Horizontal(classes="field", id="job-fields"):
                yield Label("priority", classes="label")
                priority = Input("0", id="priority", type="integer")
                priority.cursor_blink = False
                yield priority
                yield Label("delay", classes="label")
                delay = Input("", id="delay", placeholder="none, 500ms, 5s, 2m")
                delay.cursor_blink = False
                yield delay
            yield Static(id="problem", classes="problem")
            with Horizontal(classes="buttons"):
                send = "Replay" if source is not None and target is None else "Send"
                yield Button(f"{send} (ctrl+s)", variant="primary", id="send")
                yield Button("Close (esc)", id="close")

    def on_resize(self) -> None:
        # 24 lines: a shorter editor and no spare margins, so the buttons stay on screen.
        self.set_class(self.size.height < 34, "-short")
        # Fewer (60x20): the fields and buttons lose their borders too, a line each instead
        # of three, or Send and Close fall below the bottom edge.
        tiny = self.size.height < TINY
        for widget in self.query("Button, Input, Select"):
            if isinstance(widget, Button | Input | Select):
                widget.compact = tiny
        for label in self.query(".field .label"):
            # The labels' top padding lines them up with a bordered field's text.
            label.styles.padding = (0, 1, 0, 0) if tiny else None

    def on_mount(self) -> None:
        if self.replay_of is not None or self.event_for is not None:
            self.query_one("#job-fields").display = False
        self.query_one("#event-field").display = self.event_for is not None
        self.query_one("#queue-field").display = self.event_for is None
        self.check()
        if self.event_for is not None and not self.event:
            self.query_one("#event", Input).focus()
        else:
            self.query_one(TextArea).focus()
        if self.template:
            self.select_first_blank()

    # ---- the template --------------------------------------------------------------------
    def template_for(self, queue: str | None) -> str:
        info = self.workflows.get(queue or "")
        return template_text(info.body_fields) if info is not None else "{}"

    def template_label(self, queue: str | None) -> Text:
        label = Text("payload (JSON)")
        info = self.workflows.get(queue or "")
        if info is None:
            return label
        if info.body_fields:
            label.append(f": the fields {info.name} reads", style="dim")
        else:
            label.append(f": {info.name} reads no $.body field by name", style="dim")
        return label

    def select_first_blank(self) -> None:
        """Select the template's first null, so that typing replaces it."""
        area = self.query_one(TextArea)
        for row, line in enumerate(area.text.splitlines()):
            column = line.find("null")
            if column >= 0:
                area.selection = Selection((row, column), (row, column + 4))
                return

    def swap_template(self) -> None:
        """Another queue picked: its template, unless the operator has written a payload."""
        if self.replay_of is not None or self.event_for is not None:
            return
        area = self.query_one(TextArea)
        if area.text != self.template and area.text.strip() not in ("", "{}"):
            return  # edited by hand: theirs to keep
        queue = self.query_one("#queue", Select).value
        name = None if queue is Select.NULL else str(queue)
        self.template = self.template_for(name)
        area.text = self.template
        self.query_one("#payload-label", Label).update(self.template_label(name))
        if self.template != "{}":
            self.select_first_blank()

    def say(
        self, problem: str | None, blanks: list[str] | None = None, missing: list[str] | None = None
    ) -> None:
        """What stops the send (`problem`), else the template's `blanks` still null and the
        fields its workflow reads that are `missing` (the run would get nulls, or fail with
        "bad input", where its workflow reads values), else that all is well."""
        box = self.query_one("#problem", Static)
        box.set_class(problem is not None, "-bad")
        if problem:
            box.update(Text("✗ " + problem, style="bold"))
            return
        said: list[tuple[str, str]] = []
        if blanks:
            said += [("! fill in " + ", ".join(blanks), "bold khaki1"), (": still null", "khaki3")]
        if missing:
            said += [("; " if said else "! ", "khaki3"), (", ".join(missing), "bold khaki1")]
            said += [(": missing, and read by its workflow", "khaki3")]
        if said:
            box.update(Text.assemble(*said, (" (ctrl+s sends it as it is)", "khaki3")))
        else:
            box.update(Text("✓ ready to send", style="green3"))

    def check(self) -> tuple[str, Any, int, Any] | None:
        """Validate every field; say the first problem. Returns what to send, or None."""
        queue = self.query_one("#queue", Select).value
        payload, problem = check_payload(self.query_one(TextArea).text)
        if self.event_for is not None:
            event = self.query_one("#event", Input).value.strip()
            if not event:
                problem = "name the event: the one the run waits for"
            self.say(problem)
            return None if problem is not None else (event, payload, 0, None)
        if problem is None and queue is Select.NULL:
            problem = "pick a queue"
            if self.initial is not None and self.initial not in self.queues:
                known = ", ".join(self.queues) or "none"
                problem = f"unknown queue {self.initial!r} (queues: {known}): pick a queue above"
        priority_text = self.query_one("#priority", Input).value.strip() or "0"
        priority = 0
        if problem is None:
            try:
                priority = int(priority_text)
            except ValueError:
                problem = f"priority must be a whole number, not {priority_text!r}"
        delay_text = self.query_one("#delay", Input).value.strip()
        if problem is None and delay_text:
            try:
                parse_duration(delay_text)
            except ValueError as error:
                problem = f"delay: {typed_duration(error)}"
        info = self.workflows.get(str(queue))
        if self.replay_of is not None and (
            info is None or info.name != self.replay_of.workflow_name
        ):
            info = None  # a helper workflow's run: what it reads is not known here
        fields = info.body_fields if info is not None and problem is None else []
        self.say(problem, null_fields(payload, fields), missing_fields(payload, fields))
        if problem is not None:
            return None
        return str(queue), payload, priority, delay_text or None

    def on_text_area_changed(self) -> None:
        self.check()

    def on_input_changed(self) -> None:
        self.check()

    def on_select_changed(self) -> None:
        self.swap_template()
        self.check()

    async def action_send(self) -> None:
        checked = self.check()
        if checked is None:
            return
        queue, payload, priority, delay = checked
        try:
            if self.event_for is not None:
                self.sent = await self.engine.send_event(self.event_for.id, queue, payload)
                job_id = self.event_for.id
            elif self.replay_of is not None:
                job_id = await self.engine.replay(self.replay_of.id, input=payload)
            else:
                job_id = await self.engine.enqueue(queue, payload, priority=priority, delay=delay)
        except EngineError as error:
            self.say(str(error))
            return
        self.dismiss(job_id)

    def action_close(self) -> None:
        self.dismiss(None)

    async def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "send":
            await self.action_send()
        else:
            self.dismiss(None)
