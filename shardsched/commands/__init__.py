"""Every `shardsched <verb>`: its flags, the checks of its input (one line, exit 2) and the
calls into the layers below; `cli` picks the module of the verb it was given. Nothing below
this package imports it (docs/design.md, "Layout")."""
