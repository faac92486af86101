"""What a template knows, written as other tools' own files: a Jinja chat
template (:mod:`.jinja`) for the engines that only speak Jinja."""
