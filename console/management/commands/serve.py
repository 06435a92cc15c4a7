from __future__ import annotations

import signal
import subprocess
import sys
import time

from django.conf import settings
from django.core.management.base import BaseCommand

from lifecycle.enginefs import EngineHome


class Command(BaseCommand):
    help = "Run the web server and the job cluster together; Ctrl-C (or SIGTERM) stops both."

    def add_arguments(self, parser):
        parser.add_argument("address", nargs="?", default="127.0.0.1:8000")

    def handle(self, *args, address: str, **options):
        # Clear what a killed writer left behind (lock-safe, so a live writer is untouched).
        EngineHome().sweep_temporaries()
        manage = str(settings.BASE_DIR / "manage.py")
        children = [
            subprocess.Popen([sys.executable, manage, "qcluster"]),
            subprocess.Popen([sys.executable, manage, "runserver", address, "--noreload"]),
        ]

        def stop(signum, frame):
            raise KeyboardInterrupt

        signal.signal(signal.SIGTERM, stop)
        try:
            # If either one dies, the console is not whole: stop the other too.
            while all(child.poll() is None for child in children):
                time.sleep(0.5)
        except KeyboardInterrupt:
            pass
        finally:
            for child in children:
                if child.poll() is None:
                    child.send_signal(signal.SIGINT)
            deadline = time.monotonic() + 15
            for child in children:
                try:
                    child.wait(max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    child.kill()
                    child.wait()
        self.stdout.write("Stopped the web server and the job cluster.")
